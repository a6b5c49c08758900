"""Which autotune configs ever win: the picks recorded by the GPU acceptance check's rows, per kernel and dtype.

The check is bound by the CPU's Triton compiles (BENCHMARKS.md, session 27: ~7,500 builds a run), and so is a
user's first call at a new shape: every config of every kernel is compiled before the autotuner can time it. A
config that never wins at any shape the check runs (the matrix and every shipped recipe's GPU shapes) is a
candidate to prune — after the speed table at the benchmark shape confirms it does not win there either
(benchmarks/kernels.py records its picks), and then the kernel change waits in benchmarks/pending/ for its check.

    python3 benchmarks/autotune_wins.py [--sha KERNELS_SHA] [--out results/autotune_wins.md]

Reads every benchmarks/results/gpu_check*_rows.jsonl; a row's `configs` holds each kernel's pick for the last
shape it tuned in that case (one pick per kernel per case). Rows of one case repeated across calls count once
per file. No torch: it reads JSON.
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def short(cfg: str) -> str:
    """'BV: 64, num_warps: 4, num_ctas: 1, num_stages: 3, maxnreg: None' -> 'BV=64 w=4 s=3'."""
    kv = dict(re.findall(r"(\w+): ([^,]+)", cfg))
    out = [f"{k}={v}" for k, v in kv.items() if k not in ("num_warps", "num_stages", "num_ctas", "maxnreg")]
    out += [f"w={kv.get('num_warps', '?')}", f"s={kv.get('num_stages', '?')}"]
    return " ".join(out)


def wins(files, sha: str | None) -> dict:
    """{kernel: {dtype: Counter(config)}} over the rows of `files` (at kernels_sha `sha` if given)."""
    out: dict = collections.defaultdict(lambda: collections.defaultdict(collections.Counter))
    for f in files:
        last = {}
        for ln in Path(f).read_text().splitlines():
            if ln.strip():
                r = json.loads(ln)
                last[r["id"]] = r  # a file's last line of an id wins (a resumed run repeats the kept rows)
        for r in last.values():
            if sha and r.get("kernels_sha") != sha:
                continue
            for kernel, cfg in (r.get("configs") or {}).items():
                out[kernel][r["dtype"]][short(cfg)] += 1
    return out


def markdown(w: dict, sha: str | None, files) -> str:
    lines = [f"Autotune picks in {len(files)} check row files" + (f" at kernels_sha {sha}" if sha else ""),
             "", "| kernel | dtype | config: cases it won |", "|---|---|---|"]
    for kernel in sorted(w):
        for dtype in sorted(w[kernel]):
            picks = ", ".join(f"{c}: {n}" for c, n in w[kernel][dtype].most_common())
            lines.append(f"| {kernel} | {dtype} | {picks} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sha", default=None, help="only rows at this kernels_sha (default: all)")
    ap.add_argument("--out", type=Path, help="also write the table here")
    a = ap.parse_args(argv)
    files = sorted((ROOT / "benchmarks" / "results").glob("gpu_check*_rows.jsonl"))
    if not files:
        print("autotune_wins: no benchmarks/results/gpu_check*_rows.jsonl", file=sys.stderr)
        return 1
    text = markdown(wins(files, a.sha), a.sha, files)
    print(text, end="")
    if a.out:
        a.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
