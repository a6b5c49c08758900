"""Which autotune configs ever win: the picks recorded by the GPU acceptance check's rows, per kernel and dtype.

The check is bound by the CPU's Triton compiles (BENCHMARKS.md, session 27: ~7,500 builds a run), and so is a
user's first call at a new shape: every config of every kernel is compiled before the autotuner can time it. A
config that never wins at any shape the check runs (the matrix and every shipped recipe's GPU shapes) is a
candidate to prune — after the speed table at the benchmark shape confirms it does not win there either
(benchmarks/kernels.py records its picks), and then the kernel change waits in benchmarks/pending/ for its check.

    python3 benchmarks/autotune_wins.py [--sha KERNELS_SHA] [--out results/autotune_wins.md]
    python3 benchmarks/autotune_wins.py --regret 0.03 [--min-ms 0.01] [--sha ...]   # the smallest space that keeps
                                                                                    # every timed case within 3 %

Reads every benchmarks/results/gpu_check*_rows.jsonl; a row's `configs` holds each kernel's pick for the last
shape it tuned in that case (one pick per kernel per case). Rows of one case repeated across calls count once
per file. No torch: it reads JSON.

--regret R asks the better question: a pick says nothing about the margin (a config may win by 0.1 %). Rows that
carry `config_ms` (the check since session 28: every config's time at the case's shape) and the speed table's rows
(benchmarks/results/**/kernels_rows*.jsonl: `autotune_picks[kernel]["timings"]`, the benchmark shape) are the
cases; per (kernel, dtype) a greedy set cover picks the fewest configs such that in every case whose best time is at
least --min-ms (below that a launch is bound by its overheads, and the tuner's timings are noise) some kept config
is within (1 + R) of the best. What it prints is a proposal: a pruned space still needs its own check.
"""
from __future__ import annotations

import argparse
import collections
import json
import math
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


def last_rows(f) -> list:
    """A rows file's rows, one per case id: a file's last line of an id wins (a resumed run repeats the kept rows)."""
    last = {}
    for ln in Path(f).read_text().splitlines():
        if ln.strip():
            r = json.loads(ln)
            last[r["id"]] = r
    return list(last.values())


def wins(files, sha: str | None) -> dict:
    """{kernel: {dtype: Counter(config)}} over the rows of `files` (at kernels_sha `sha` if given)."""
    out: dict = collections.defaultdict(lambda: collections.defaultdict(collections.Counter))
    for f in files:
        for r in last_rows(f):
            if sha and r.get("kernels_sha") != sha:
                continue
            for kernel, cfg in (r.get("configs") or {}).items():
                out[kernel][r["dtype"]][short(cfg)] += 1
    return out


def _ms(t):
    t = t[0] if isinstance(t, (list, tuple)) else t
    return None if t is None or not math.isfinite(float(t)) else float(t)


def timed_cases(files, sha: str | None, speed_files=()) -> dict:
    """{(kernel, dtype): [(case, {short config: ms})]} from the check rows' config_ms and the speed rows' timings."""
    out: dict = collections.defaultdict(list)
    for f in files:
        for r in last_rows(f):
            if sha and r.get("kernels_sha") != sha:
                continue
            for kernel, tm in (r.get("config_ms") or {}).items():
                ms = {short(c): _ms(t) for c, t in tm.items()}
                out[(kernel, r["dtype"])].append((f"{Path(f).name}:{r['id']}", ms))
    for f in speed_files:
        for i, ln in enumerate(Path(f).read_text().splitlines()):
            r = json.loads(ln) if ln.strip() else {}
            for kernel, picks in (r.get("autotune_picks") or {}).items():
                tm = picks.get("timings") if isinstance(picks, dict) else None
                if tm:  # the benchmark shape of kernels.py: bf16
                    ms = {short(c): _ms(t) for c, t in tm.items()}
                    out[(kernel, "bfloat16")].append((f"{Path(f).parent.name}/{Path(f).name}:{i}", ms))
    return out


def cover(cases: list, limit: float, min_ms: float) -> dict:
    """The fewest configs (greedy) that keep every case whose best is >= min_ms within (1 + limit) of its best."""
    configs = sorted({c for _, ms in cases for c in ms})
    live = [(cid, ms) for cid, ms in cases if any(t is not None for t in ms.values())
            and min(t for t in ms.values() if t is not None) >= min_ms]
    best = {cid: min(t for t in ms.values() if t is not None) for cid, ms in live}
    ok = {c: {cid for cid, ms in live if ms.get(c) is not None and ms[c] <= (1 + limit) * best[cid]}
          for c in configs}
    left, kept = set(best), []
    while left:  # most cases covered first; ties: the smaller summed relative time
        c = max((c for c in configs if c not in kept), key=lambda c: (
            len(ok[c] & left), -sum((ms.get(c) or 1e9) / best[cid] for cid, ms in live)))
        kept.append(c)
        left -= ok[c]
    worst = max((min((ms[c] for c in kept if ms.get(c) is not None), default=math.inf) / best[cid]
                 for cid, ms in live), default=1.0)
    return {"configs": configs, "kept": kept, "cases": len(cases), "timed": len(live), "worst": worst}


def regret_markdown(tc: dict, limit: float, min_ms: float, sha: str | None) -> str:
    lines = [f"Smallest autotune spaces within {limit:.0%} of the best in every case (cases with a best >= "
             f"{min_ms} ms){' at kernels_sha ' + sha if sha else ''}", "",
             "| kernel | dtype | cases (timed) | configs | kept | worst with kept | dropped |", "|---|---|---|---|---|---|---|"]
    for (kernel, dtype) in sorted(tc):
        r = cover(tc[(kernel, dtype)], limit, min_ms)
        dropped = [c for c in r["configs"] if c not in r["kept"]]
        lines.append(f"| {kernel} | {dtype} | {r['cases']} ({r['timed']}) | {len(r['configs'])} | "
                     f"{', '.join(r['kept']) or '-'} | {r['worst']:.3f} | {', '.join(dropped) or '-'} |")
    return "\n".join(lines) + "\n"


PRECISION = {"float32": "fp32", "bfloat16": "16bit", "float16": "16bit"}  # autotune_spaces.py's two tables


def _entry(cfg: str) -> tuple:
    """'BV=64 w=4 s=3' -> (64, 4, 3); 'w=4 s=1' -> (None, 4, 1): autotune_spaces.SPACES's entries."""
    kv = dict(kv.split("=") for kv in cfg.split())
    return (int(kv["BV"]) if "BV" in kv else None, int(kv["w"]), int(kv["s"]))


def spaces(files, sha: str | None, speed_files, limit: float, min_ms: float, recipes_only: bool = True) -> dict:
    """{kernel: {precision: {entry}}}: per kernel and precision, the regret cover's configs over the timed cases,
    and the pick of every case id that has no timings for that kernel (older rows record picks only), so nothing
    a check ever ran loses its winner. A precision none of whose cases is timed or picked keeps its whole space."""
    tc = timed_cases(files, sha, speed_files)
    out: dict = collections.defaultdict(lambda: collections.defaultdict(set))
    timed_ids = collections.defaultdict(set)
    for (kernel, dtype), cases in tc.items():
        out[kernel][PRECISION[dtype]] |= {_entry(c) for c in cover(cases, limit, min_ms)["kept"]}
        timed_ids[(kernel, dtype)] |= {cid.split(":", 1)[1] for cid, _ in cases}
    for f in files:
        for r in last_rows(f):
            if sha and r.get("kernels_sha") != sha:
                continue
            for kernel, cfg in (r.get("configs") or {}).items():
                if recipes_only and r.get("source") == "matrix":
                    continue  # the matrix's 2 x 300 correctness shapes: launch-bound, any config that runs will do
                if r["id"] not in timed_ids[(kernel, r["dtype"])]:
                    out[kernel][PRECISION[r["dtype"]]].add(_entry(short(cfg)))
    return {k: {p: v for p, v in d.items() if v} for k, d in out.items()}


def spaces_python(sp: dict, limit: float) -> str:
    lines = [f"# autotune_wins.py --spaces --regret {limit}: the regret cover plus untimed cases' picks"]
    for kernel in sorted(sp):
        lines.append(f"    {kernel!r}: {{")
        for prec in sorted(sp[kernel]):
            lines.append(f"        {prec!r}: {sorted(sp[kernel][prec], key=str)!r},")
        lines.append("    },")
    return "\n".join(lines) + "\n"


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
    ap.add_argument("--regret", type=float, default=None,
                    help="print the smallest spaces within this fraction of the best in every timed case instead")
    ap.add_argument("--min-ms", type=float, default=0.01, help="with --regret: cases whose best is under this are noise")
    ap.add_argument("--spaces", action="store_true",
                    help="with --regret: print the kept configs as autotune_spaces.SPACES entries (the regret cover "
                         "plus the pick of every case without timings)")
    a = ap.parse_args(argv)
    files = sorted((ROOT / "benchmarks" / "results").glob("gpu_check*_rows.jsonl"))
    if not files:
        print("autotune_wins: no benchmarks/results/gpu_check*_rows.jsonl", file=sys.stderr)
        return 1
    if a.regret is not None:
        speed = sorted((ROOT / "benchmarks" / "results").glob("**/kernels_rows*.jsonl"))
        text = (spaces_python(spaces(files, a.sha, speed, a.regret, a.min_ms), a.regret) if a.spaces
                else regret_markdown(timed_cases(files, a.sha, speed), a.regret, a.min_ms, a.sha))
    else:
        text = markdown(wins(files, a.sha), a.sha, files)
    print(text, end="")
    if a.out:
        a.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
