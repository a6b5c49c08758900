"""The sm_90 registers and spills of each `benchmarks/dqkwg_diag.py` variant of the gated per-chunk gradient kernel,
found without a GPU: each variant's chunk_bwd.py is written over kernels/delta_product/chunk_bwd.py, compiled by
`benchmarks/kernel_resources.py` (Triton's own compiler + ptxas, every autotune config), and the file is restored.

    python benchmarks/dqkwg_spills.py                         # every variant, bf16, d 128, n_h 1,2,3
    python benchmarks/dqkwg_spills.py gated -R --extra dg-pass=/tmp/chunk_bwd_dgpass.py --ns 2

Why: the gated build spills ~250 B a thread more than the non-gated one at the configs the autotuner picks; which
gate-gradient term holds them says what is worth moving (issue 14 item 4). Refuses to run while chunk_bwd.py has
uncommitted changes (it is overwritten for the duration, and restored even on failure).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KFILE = os.path.join(ROOT, "kernels", "delta_product", "chunk_bwd.py")


def diag_tables():
    """SUBS and VARIANTS of dqkwg_diag.py, read from its source (importing it needs a CUDA-capable torch setup)."""
    txt = open(os.path.join(ROOT, "benchmarks", "dqkwg_diag.py")).read()
    ns = {}
    exec(txt[txt.index("SUBS = {"):txt.index("EXTRA = {}")], ns)
    return ns["SUBS"], ns["VARIANTS"]


def variant_source(name, src0, subs, variants, extra):
    """chunk_bwd.py's source src0 with variants[name]'s terms taken out by subs (each old text must match exactly
    once: a kernel edit that moves one fails loudly), or extra[name]'s whole file (dqkwg_diag.py builds its timed
    modules with this too)."""
    if name in extra:
        return open(extra[name]).read()
    src = src0
    for term in variants.get(name, []):
        for old, new in subs[term]:
            if src.count(old) != 1:
                raise SystemExit(f"term {term!r}: {old.strip()[:60]!r} matches {src.count(old)} times in {KFILE} (the "
                                 "kernel changed: update dqkwg_diag.SUBS)")
            src = src.replace(old, new)
    return src


def main():
    subs, variants = diag_tables()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("variants", nargs="*", help=f"default: all of {', '.join(variants)} and every --extra")
    ap.add_argument("--extra", action="append", default=[], metavar="NAME=FILE", help="a whole chunk_bwd.py")
    ap.add_argument("--ns", default="1,2,3")
    ap.add_argument("--dims", default="128")
    a = ap.parse_args()
    extra = dict(e.partition("=")[::2] for e in a.extra)
    names = a.variants or [v for v in variants if v != "plain"] + list(extra)
    for n in names:
        if n not in variants and n not in extra:
            raise SystemExit(f"dqkwg_spills: unknown variant {n!r}")
    dirty = subprocess.run(["git", "status", "--porcelain", KFILE], cwd=ROOT, capture_output=True, text=True).stdout
    if dirty.strip():
        raise SystemExit(f"dqkwg_spills: {KFILE} has uncommitted changes; commit or stash them first")
    src0 = open(KFILE).read()
    print("| variant | n_h | config | spill st/ld (B) | regs | bar.sync / shfl (PTX) |\n|---|---|---|---|---|---|")
    try:
        for name in names:
            with open(KFILE, "w") as f:
                f.write(variant_source(name, src0, subs, variants, extra))
            out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "kernel_resources.py"), "--dtypes",
                                  "bf16", "--dims", a.dims, "--ns", a.ns, "--gated", "1" if name != "plain" else "0",
                                  "--kernels", "dqkwg"], capture_output=True, text=True, cwd=ROOT)
            rows = [r.split("|") for r in out.stdout.splitlines() if r.startswith("| chunk_dp_bwd_kernel_dqkwg")]
            if not rows:
                raise SystemExit(f"dqkwg_spills: {name}: no build\n{out.stderr[-2000:]}")
            for r in rows:
                print(f"| {name} | {r[4].strip()} | {r[6].strip()} | {r[10].strip()} | {r[9].strip()} | {r[11].strip()} |",
                      flush=True)
    finally:
        with open(KFILE, "w") as f:
            f.write(src0)


if __name__ == "__main__":
    main()
