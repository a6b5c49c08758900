"""Which autotune configs ever win: the picks recorded by the GPU acceptance check's rows, per kernel and dtype.

The check is bound by the CPU's Triton compiles (BENCHMARKS.md, session 27: ~7,500 builds a run), and so is a
user's first call at a new shape: every config of every kernel is compiled before the autotuner can time it. A
config that never wins at any shape the check runs (the matrix and every shipped recipe's GPU shapes) is a
candidate to prune — after the speed table at the benchmark shape confirms it does not win there either
(benchmarks/kernels.py records its picks), and then the kernel change waits in benchmarks/pending/ for its check.

    python3 benchmarks/autotune_wins.py [--sha KERNELS_SHA] [--out results/autotune_wins.md]
    python3 benchmarks/autotune_wins.py --regret 0.03 [--min-ms 0.01] [--sha ...]   # the smallest space that keeps
                                                                                    # every timed case within 3 %
    python3 benchmarks/autotune_wins.py --regret 0.03 --spaces --sha 589682e8719e83da \
        --fits benchmarks/results/kernel_resources_s31_*.json [--write kernels/delta_product/autotune_spaces.py]
                                        # that cut per head-dim bucket as autotune_spaces.SPACES (pending patch),
                                        # from main's rows only (a pruned tree's rows time only what it kept), with
                                        # a config that fits kept at every sm_90 launch the --fits files list

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


def timed_cases(files, sha: str | None, speed_files=(), by=lambda kernel, dtype, k: (kernel, dtype)) -> dict:
    """{by(kernel, dtype, K): [(case, {short config: ms})]} from the check rows' config_ms and the speed rows' timings
    (K: the case's head dim; the speed table's shape is d 128). By default the cases of one (kernel, dtype)."""
    out: dict = collections.defaultdict(list)
    for f in files:
        for r in last_rows(f):
            if sha and r.get("kernels_sha") != sha:
                continue
            for kernel, tm in (r.get("config_ms") or {}).items():
                ms = {short(c): _ms(t) for c, t in tm.items()}
                out[by(kernel, r["dtype"], r["K"])].append((f"{Path(f).name}:{r['id']}", ms))
    for f in speed_files:
        for i, ln in enumerate(Path(f).read_text().splitlines()):
            r = json.loads(ln) if ln.strip() else {}
            for kernel, picks in (r.get("autotune_picks") or {}).items():
                tm = picks.get("timings") if isinstance(picks, dict) else None
                if tm:  # the benchmark shape of kernels.py: bf16
                    ms = {short(c): _ms(t) for c, t in tm.items()}
                    cid = f"{Path(f).parent.name}/{Path(f).name}:{i}"
                    out[by(kernel, "bfloat16", r.get("K", 128))].append((cid, ms))
    return out


def cover(cases: list, limit: float, min_ms: float) -> dict:
    """The fewest configs (greedy) that keep every case whose best is >= min_ms within (1 + limit) of its best."""
    configs = sorted({c for _, ms in cases for c in ms})
    live = [(cid, ms) for cid, ms in cases if any(t is not None for t in ms.values())
            and min(t for t in ms.values() if t is not None) >= min_ms]
    best = {cid: min(t for t in ms.values() if t is not None) for cid, ms in live}
    ok = {c: {cid for cid, ms in live if ms.get(c) is not None and ms[c] <= (1 + limit) * best[cid]}
          for c in configs}
    # each config's time relative to each timed case's best, summed (a case it did not run in counts 1e9)
    cost = {c: sum((ms.get(c) or 1e9) / best[cid] for cid, ms in live) for c in configs}
    left, kept = set(best), []
    while left:  # most cases covered first; ties: the smaller summed relative time
        c = max((c for c in configs if c not in kept), key=lambda c: (len(ok[c] & left), -cost[c]))
        kept.append(c)
        left -= ok[c]
    worst = max((min((ms[c] for c in kept if ms.get(c) is not None), default=math.inf) / best[cid]
                 for cid, ms in live), default=1.0)
    return {"configs": configs, "kept": kept, "cases": len(cases), "timed": len(live), "worst": worst,
            "cost": cost}


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


def bucket(k: int) -> int:
    """The head-dim class of a case: its K rounded up to a power of two, at least 32 (BK, the kernels' K tile: 85 and
    128 share one), as kernels/delta_product/autotune_spaces.py buckets a launch."""
    b = 32
    while b < k:
        b *= 2
    return b


def fit_launches(fits_files) -> dict:
    """{(kernel, precision, bucket): [{entry: fits}, ...]}, one dict per launch, from benchmarks/kernel_resources.py
    --whole-space --json files (every config of every launch compiled for sm_90 on the CPU)."""
    out: dict = collections.defaultdict(list)
    for f in fits_files:
        data = json.loads(Path(f).read_text())
        for x in data["launches"]:
            prec = "fp32" if x["dtype"] == "fp32" else "16bit"
            fit = {_entry(c["config"]): c.get("error") is None and c.get("shared", math.inf) <= data["limit"]
                   for c in x["configs"]}
            out[(x["kernel"], prec, bucket(x["d"]))].append(fit)
    return out


def spaces(files, sha: str | None, speed_files, limit: float, min_ms: float, min_cases: int = 2,
           fits_files=()) -> dict:
    """{kernel: {precision: {bucket: {entry}}}}: per kernel, precision and head-dim bucket, the regret cover's
    configs over the timed cases of that bucket (check rows with config_ms, and the speed table's rows, which are
    bf16 at d 128). A (kernel, precision, bucket) with fewer than `min_cases` timed cases (best >= min_ms) is left
    out, so it keeps its whole space: one contended timing is not evidence enough to drop a config.

    Why per bucket: the best config follows the tile sizes (session 29's 73 timed cases: dqkwg's 4-warp build is the
    best at K <= 64 and 1.2-2x slower at K >= 85; h, h_super and o_tok keep one or two configs a bucket), so one
    space for all head dims keeps the union of every bucket's winners (bf16: 44 builds a forward + backward at d 128
    against ~20 per bucket). Picks without timings (rows before session 28) are not added: a pick carries no margin,
    and at the check's launch-bound shapes it is the tuner's noise.

    fits_files (kernel_resources.py --whole-space --json): at each launch they list whose kept configs all exceed
    the SM's shared memory (session 31: dqkwg's 8 warps / 2 stages, kept at 16-bit d 256 from gated and n_h >= 3
    cases, needs 233-270 KB non-gated at n_h 1-3), the config that fits there with the least summed time relative
    to each timed case's best (the cover's cost) is kept too (untimed: the first that fits, in the space's order).
    Without it such a launch widens to its whole space at run time (kernels.utils.launch): correct, but every config
    is compiled."""
    tc = timed_cases(files, sha, speed_files, by=lambda kernel, dtype, k: (kernel, PRECISION[dtype], bucket(k)))
    fl = fit_launches(fits_files)
    out: dict = collections.defaultdict(lambda: collections.defaultdict(dict))
    for (kernel, prec, b), cases in sorted(tc.items()):
        r = cover(cases, limit, min_ms)
        kept = r["kept"]
        if kept and r["timed"] >= min_cases:
            keep = {_entry(c) for c in kept}
            cost = {_entry(c): t for c, t in r["cost"].items()}
            for fit in fl.get((kernel, prec, b), []):
                if not any(fit.get(e) for e in keep):
                    ok = [e for e in fit if fit[e]]
                    if ok:  # none fits at all: kernel_resources reports that launch itself
                        keep.add(min(ok, key=lambda e: (cost.get(e, math.inf), ok.index(e))))
            out[kernel][prec][b] = keep
    return {k: dict(d) for k, d in out.items()}


BEGIN, END = "# BEGIN SPACES (benchmarks/autotune_wins.py --spaces --write)", "# END SPACES"


def spaces_python(sp: dict, limit: float) -> str:
    lines = [BEGIN, f"# the regret cover within {limit:.0%} of each timed case's best, per head-dim bucket",
             "SPACES: dict[str, dict[str, dict[int, set]]] = {"]
    for kernel in sorted(sp):
        lines.append(f"    {kernel!r}: {{")
        for prec in sorted(sp[kernel]):
            pad = " " * (len(repr(prec)) + 11)
            body = f",\n{pad}".join(f"{b}: {{{', '.join(map(repr, sorted(sp[kernel][prec][b], key=str)))}}}"
                                    for b in sorted(sp[kernel][prec]))
            lines.append(f"        {prec!r}: {{{body}}},")
        lines.append("    },")
    return "\n".join(lines + ["}", END]) + "\n"


def write_spaces(path: Path, text: str) -> None:
    """Replace the block between BEGIN and END in `path` (kernels/delta_product/autotune_spaces.py) by `text`."""
    src = path.read_text()
    if BEGIN not in src or END not in src:
        raise SystemExit(f"autotune_wins: {path}: no '{BEGIN}' ... '{END}' block to replace")
    head, rest = src.split(BEGIN, 1)
    path.write_text(head + text.rstrip("\n") + rest.split(END, 1)[1])


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
                    help="with --regret: print the kept configs as autotune_spaces.SPACES, per head-dim bucket")
    ap.add_argument("--min-cases", type=int, default=2,
                    help="with --spaces: a bucket is pruned only with at least this many timed cases")
    ap.add_argument("--fits", type=Path, nargs="*", default=[],
                    help="with --spaces: kernel_resources.py --whole-space --json files; a launch there whose kept "
                    "configs all exceed shared memory keeps one that fits")
    ap.add_argument("--write", type=Path, help="with --spaces: replace the SPACES block of this file (a tree with "
                    "benchmarks/pending/autotune-spaces.patch applied: kernels/delta_product/autotune_spaces.py)")
    a = ap.parse_args(argv)
    files = sorted((ROOT / "benchmarks" / "results").glob("gpu_check*_rows.jsonl"))
    if not files:
        print("autotune_wins: no benchmarks/results/gpu_check*_rows.jsonl", file=sys.stderr)
        return 1
    if a.regret is not None:
        speed = sorted((ROOT / "benchmarks" / "results").glob("**/kernels_rows*.jsonl"))
        text = (spaces_python(spaces(files, a.sha, speed, a.regret, a.min_ms, a.min_cases, a.fits), a.regret)
                if a.spaces
                else regret_markdown(timed_cases(files, a.sha, speed), a.regret, a.min_ms, a.sha))
    else:
        text = markdown(wins(files, a.sha), a.sha, files)
    print(text, end="")
    if a.write is not None:
        if not a.spaces:
            ap.error("--write needs --spaces")
        write_spaces(a.write, text)
    if a.out:
        a.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
