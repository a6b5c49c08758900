"""Where the gated per-chunk gradient kernel loses time (issue 14 item 4): each gate-gradient term of
`chunk_dp_bwd_kernel_dqkwg` taken out in turn, timed beside the gated and non-gated kernels on the same inputs.

    python3 benchmarks/dqkwg_diag.py --out DIR [--ns 1,2,3] [--jobs 12]     # one CUDA GPU, ~2-4 minutes

Why: at B=4, T=4096, H=16, d=128, bf16 (H200, session 18) the gated kernel takes 1.587 ms against 1.174 non-gated
at n_h 2 (2.420 / 1.850 at n_h 3), while its extra work is a few [64, 64] elementwise products, one 32 x 64 x 128
product (R = D * QK^T) and some reductions. Removing R alone (dg-sums, session 22) gained ~2 %. This script says
which term costs: variants of the kernel are built from chunk_bwd.py's own source with one term's statements replaced
(SUBS below; each must match exactly once, so a drift of the kernel fails loudly), imported as sibling modules of
chunk_bwd, and launched through the same wrapper with autotuning on. The variants' gate gradients are wrong by
construction (they time, they do not compute); "gated" and "plain" are main's kernel. It also times a separate
reduction `sum(S * dS_next)` per chunk (what moving the `gam` term out of the kernel would add).

Phase 1 compiles every (variant, n_h) in parallel processes (`--jobs`) into one Triton cache; phase 2 times them
one after another in one process. Nothing under kernels/ changes. Writes DIR/dqkwg_diag.json and .md.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import dpx.kernels  # noqa: F401
except ImportError:  # repo checkout without `pip install -e .`: expose kernels/ as dpx.kernels
    from dpx_checkout import expose_kernels
    expose_kernels()

import dpx.kernels.delta_product.chunk_bwd as chunk_bwd  # noqa: E402
from dpx_checkout import load_script  # noqa: E402

_bk = load_script(os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels.py"), "dpx_bench_kernels")
bench, stage_inputs = _bk.bench, _bk.stage_inputs

# term -> [(text in chunk_bwd.py, replacement)]; the replacement keeps the kernel valid Python and its shapes
SUBS = {
    # each replacement also takes out the reductions of what it zeroes: Triton does not fold tl.sum of a constant
    # tensor (a cross-warp reduction, barriers included, runs on zeros), so "-R" replacing R alone kept its two sums
    "gam": [("        b_dgam += tl.sum(b_h.to(tl.float32) * b_dh.to(tl.float32), 1)\n", ""),
            ("b_dgs = tl.sum(b_dgam, 0)", "b_dgs = 0.0")],
    "dgq0": [("        b_dGq0 = scale * b_eGq * tl.sum(b_q.to(tl.float32) * b_dqS, 1)\n", "        pass\n")],
    "kdk": [("b_kdk = tl.sum(b_dk * b_k.to(tl.float32), 1) * b_ed", "b_kdk = b_ed"),
            ("tl.sum(b_kdk, 0) + b_dgs", "b_dgs")],
    "M": [("        b_M = b_dA * b_KK * b_b[:, None]\n        b_Ms1 = tl.sum(b_M, 1)\n        b_Ms0 = tl.sum(b_M, 0)\n",
           "        pass\n")],
    "R": [("        b_dG -= tl.sum(b_R, 0)\n", ""), ("b_dGq = b_dGq0 + tl.sum(b_R, 1)", "b_dGq = b_dGq0")],
    "cumsum": [("b_dgi = tl.cumsum(b_dG, 0, reverse=True)", "b_dgi = b_dG")],
    # the [BT, BL] masked sum that moves dGq from tokens to their read-out steps (dGq stays live: a scalar sum)
    "scatter": [("b_dG += tl.sum(tl.where((o_t * NH + NH - 1)[:, None] == o_l[None, :], b_dGq[:, None], 0), 0)",
                 "b_dG += tl.sum(b_dGq, 0)")],
}
TERMS = ("gam", "dgq0", "kdk", "M", "R", "cumsum")  # the "-all*" variants (session 25's spill table) take these
VARIANTS = {"gated": [], "plain": [], **{f"-{t}": [t] for t in SUBS}, "-all": list(TERMS),
            "-all-but-gam": [t for t in TERMS if t != "gam"], "-all-but-R": [t for t in TERMS if t != "R"]}


EXTRA = {}  # name -> a whole chunk_bwd.py (--extra NAME=FILE: e.g. a pending patch's version), timed as written


def variant_module(name: str, tmp: str):
    """chunk_bwd with VARIANTS[name]'s terms taken out (or EXTRA[name]), as module dpx.kernels.delta_product._diag_<i>."""
    if name in ("gated", "plain"):
        return chunk_bwd
    from dqkwg_spills import variant_source  # the one substitution loop (dqkwg_spills has no torch import)
    src = variant_source(name, open(chunk_bwd.__file__).read(), SUBS, VARIANTS, EXTRA)
    mod_name = "_diag_" + "".join(c if c.isalnum() else "_" for c in name)
    path = os.path.join(tmp, mod_name + ".py")
    with open(path, "w") as f:
        f.write(src)
    full = "dpx.kernels.delta_product." + mod_name
    spec = importlib.util.spec_from_file_location(full, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[full] = mod
    spec.loader.exec_module(mod)
    return mod


@triton.jit
def gam_kernel(h, dh, out, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    # sum(S * dS_next) of one (chunk, head): the gate gradient's state term as its own pass
    i_ch = tl.program_id(0).to(tl.int64)
    o_k = tl.arange(0, BK)
    acc = tl.zeros([BK, BV], dtype=tl.float32)
    for i_v in range(0, tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        p = i_ch * K * V + o_k[:, None] * V + o_v[None, :]
        m = (o_k[:, None] < K) & (o_v[None, :] < V)
        acc += tl.load(h + p, mask=m, other=0).to(tl.float32) * tl.load(dh + p, mask=m, other=0).to(tl.float32)
    tl.store(out + i_ch, tl.sum(tl.sum(acc, 1), 0))


def run(names, n, gated_shape, reps, timing):
    B, T, H, K, V = gated_shape
    x = stage_inputs(B, T, H, K, V, n, True, torch.bfloat16, "cuda")
    args = [x[a] for a in ("q", "k", "v", "beta", "G", "t", "h", "dh", "vn", "dvn", "do", "tab")]
    tmp = tempfile.mkdtemp(prefix="dqkwg_diag_")
    rows = {}
    refs = {g: chunk_bwd.chunk_dp_bwd_dqkwg(*args, x["sc"], g, x["p"]) for g in (True, False)}
    for name in names:
        mod = variant_module(name, tmp)
        gated = not name.endswith("plain")  # "plain", and an --extra named "<x>-plain": the non-gated build
        ref = refs[gated]
        fn = lambda: mod.chunk_dp_bwd_dqkwg(*args, x["sc"], gated, x["p"])
        out = fn()
        torch.cuda.synchronize()
        # the non-gate gradients must not move (a variant that changed them would time other work)
        same = all(torch.equal(a, b) for a, b in zip(out[:4], ref[:4]))
        rows[name] = {"ms": bench(fn, warmup=10, rep=reps) if timing else None, "dq_dk_dv_dbeta_equal_main": same}
        if name in EXTRA and not same:  # another summation order (e.g. other tiles): how far, relative
            rows[name]["dq_dk_dv_dbeta_rel_diff_main"] = max(
                ((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in zip(out[:4], ref[:4]))
        if name in EXTRA and gated:  # a real rewrite computes the gate gradient too: how far from main's
            fin = torch.isfinite(ref[4])  # the staged inputs are random, not a trained model's: some dg overflow
            rows[name]["dg_rel_diff_main"] = ((out[4] - ref[4])[fin].norm() / ref[4][fin].norm()).item()
            rows[name]["dg_same_nonfinite"] = bool(torch.equal(fin, torch.isfinite(out[4])))
        print(f"n_h {n} {name:14s} {rows[name]}", flush=True)
    if timing:
        NCH = x["h"].shape[0] * x["h"].shape[1]
        o = torch.empty(NCH, device="cuda", dtype=torch.float32)
        gam = lambda: gam_kernel[(NCH,)](x["h"], x["dh"], o, K=K, V=V, BK=triton.next_power_of_2(K), BV=32,
                                         num_warps=4)
        gam()
        ref_gam = (x["h"].float() * x["dh"].float()).sum((-1, -2)).flatten()
        rows["gam_pass"] = {"ms": bench(gam, warmup=10, rep=reps),
                            "rel_err": ((o - ref_gam).norm() / ref_gam.norm()).item()}
        print(f"n_h {n} gam_pass {rows['gam_pass']}", flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--ns", default="2,3,1")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--shape", default="4,4096,16,128,128", help="B,T,H,K,V")
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--extra", action="append", default=[], metavar="NAME=FILE",
                    help="also time a whole chunk_bwd.py (e.g. the kernels of a pending patch) as variant NAME")
    ap.add_argument("--compile-only", action="store_true", help="(phase 1, one process per variant and n_h)")
    a = ap.parse_args()
    for e in a.extra:
        name, _, path = e.partition("=")
        if not os.path.isfile(path):
            raise SystemExit(f"dqkwg_diag: --extra {e!r}: no file {path!r}")
        EXTRA[name] = os.path.abspath(path)
    shape = tuple(int(s) for s in a.shape.split(","))
    ns = [int(s) for s in a.ns.split(",")]
    names = a.variants.split(",")
    if not a.compile_only:  # a compile process builds only the variant it is given
        names += [n for n in EXTRA if n not in names]
    if a.compile_only:
        for n in ns:
            run(names, n, shape, a.reps, timing=False)
        return
    t0 = time.time()
    procs, jobs = [], [(n, v) for n in ns for v in names if v not in ("gated", "plain")]
    for n, v in jobs:  # phase 1: build every variant's binaries in parallel (same Triton cache as phase 2)
        while sum(p.poll() is None for p in procs) >= a.jobs:
            time.sleep(0.5)
        procs.append(subprocess.Popen([sys.executable, __file__, "--compile-only", "--ns", str(n), "--variants", v,
                                       *[f"--extra={e}" for e in a.extra],
                                       "--shape", "1,256," + ",".join(map(str, shape[2:]))],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    for p, (n, v) in zip(procs, jobs):
        err = p.communicate()[1].decode()[-400:]
        if p.returncode:
            print(f"compile n_h {n} {v}: rc {p.returncode}: {err}", flush=True)
    print(f"phase 1 (compile) {time.time() - t0:.0f} s", flush=True)
    result = {"shape": shape, "device": torch.cuda.get_device_name(), "triton": triton.__version__, "rows": {}}
    for n in ns:
        result["rows"][n] = run(names, n, shape, a.reps, timing=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "dqkwg_diag.json"), "w") as f:
        json.dump(result, f, indent=1)
    lines = ["| n_h | variant | ms | / plain | / gated |", "|---|---|---|---|---|"]
    for n, rows in result["rows"].items():
        pl, ga = rows["plain"]["ms"], rows["gated"]["ms"]
        for name, r in rows.items():
            lines.append(f"| {n} | {name} | {r['ms']:.3f} | {r['ms'] / pl:.3f} | {r['ms'] / ga:.3f} |")
    with open(os.path.join(a.out, "dqkwg_diag.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
