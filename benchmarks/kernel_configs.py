"""Time every candidate launch config of each DeltaProduct kernel alone on one GPU, beside what its autotuner picks.

    python3 benchmarks/kernel_configs.py --out DIR [--ns 1,2,3] [--jobs 12] [--budget-s 300]

Why: the autotune spaces in kernels/delta_product/ were cut to what compiled and ran on Hopper (2 stages, 4/8
warps); fla's kernels also try 2 warps and 3-4 stages. This measures, at the benchmark shape of kernels.py (B=4,
T=4096, H=16, d=128, bf16), what each (BV, warps, stages) would give, so that a change of an autotune space is
decided by a measurement, and BENCHMARKS.md can say which configs pay.

Each (kernel, n_h, gated) is one process (a config that faults kills only its own row; the parent records the exit
code). Compiles run in parallel; the timings take a file lock, so one process at a time times on the GPU.
Output: DIR/kernel_configs.jsonl (one row per config: kernel, n, gated, config, ms or error) and
DIR/kernel_configs.md (per kernel: the autotuned time, the best candidate, their ratio).
"""
from __future__ import annotations

import argparse
import fcntl
import itertools
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = ("wu", "fwd_h", "fwd_o", "h_super", "o_super", "dv_local", "dh", "dqkwg", "inv")
BWD = ("dv_local", "dh", "dqkwg")
WARPS, STAGES = (2, 4, 8), (1, 2, 3, 4)


def candidates(name):
    import triton
    bvs = {"wu": (32, 64, 128), "fwd_h": (32, 64), "h_super": (32, 64), "fwd_o": (32, 64, 128),
           "o_super": (32, 64, 128), "dh": (32, 64)}.get(name, (None,))
    stages = (1, 2) if name in ("dqkwg", "inv") else STAGES  # dqkwg holds five accumulators: more stages do not fit
    return [triton.Config({} if bv is None else {"BV": bv}, num_warps=w, num_stages=s)
            for bv, w, s in itertools.product(bvs, WARPS, stages)]


def label(cfg):
    kw = ",".join(f"{k}={v}" for k, v in cfg.kwargs.items())
    return f"{kw + ' ' if kw else ''}w{cfg.num_warps} s{cfg.num_stages}"


def job(name, n, gated, out, lock_path, budget_s, small=False):
    """One (kernel, n, gated): the autotuned time, then each candidate pinned alone."""
    import torch
    import triton
    sys.path.insert(0, HERE)
    from kernels import stage_inputs  # benchmarks/kernels.py: the same inputs as its stage table
    from dpx.kernels.delta_product import chunk_bwd as cb, chunk_h as ch, chunk_o as co, chunk_super as cs
    from dpx.kernels.delta_product import wy_fast as wf
    from dpx.kernels.utils import autotuner

    t0 = time.time()
    dev, dtype = ("cuda", torch.bfloat16) if torch.cuda.is_available() else ("cpu", torch.float32)
    B, T, H, K, V = (1, 64, 2, 32, 32) if small else (4, 4096, 16, 128, 128)  # small: the CPU plumbing test
    x = stage_inputs(B, T, H, K, V, n, gated, dtype, dev)
    q, k, v, g, beta, do, tab, sc, p = (x[nm] for nm in ("q", "k", "v", "g", "beta", "do", "tab", "sc", "p"))
    w, u, gamma, G, t, h, vn, dvl, dh, dvn = (x[nm] for nm in ("w", "u", "gamma", "G", "t", "h", "vn", "dvl", "dh",
                                                                "dvn"))
    ug = g is not None
    calls = {
        "inv": (wf.chunk_dp_fwd_kernel_inv, lambda: wf.chunk_dp_fwd_inv(k, beta, g, tab)),
        "wu": (wf.chunk_dp_fwd_kernel_wu, lambda: wf.chunk_dp_fwd_wu(k, v, beta, G, t, tab, p)),
        "fwd_h": (ch.chunk_dp_fwd_kernel_h, lambda: ch.chunk_dp_fwd_h(w, u, k, G, gamma, None, tab, False, dtype, p, ug)),
        "fwd_o": (co.chunk_dp_fwd_kernel_o, lambda: co.chunk_dp_fwd_o(q, k, G, h, vn, tab, sc, p)),
        "dv_local": (cb.chunk_dp_bwd_kernel_dv_local, lambda: cb.chunk_dp_bwd_dv_local(q, k, G, do, tab, sc, p)),
        "dh": (ch.chunk_dp_bwd_kernel_dh,
               lambda: ch.chunk_dp_bwd_dh(q, do, w, k, gamma, G, dvl, None, tab, sc, False, p, ug)),
        "dqkwg": (cb.chunk_dp_bwd_kernel_dqkwg,
                  lambda: cb.chunk_dp_bwd_dqkwg(q, k, v, beta, G, t, h, dh, vn, dvn, do, tab, sc, g is not None, p)),
    }
    if n > 1 and name in ("h_super", "o_super"):  # the super-chunk pair, each alone
        from dpx.kernels.utils import launch, next_pow2
        from dpx.kernels.delta_product.index import BL, query_tile
        hs = w.new_empty(tab.NSC, H, K, V, dtype=dtype)
        hsup = lambda: launch(cs.chunk_dp_fwd_kernel_h_super, lambda m: (triton.cdiv(V, m["BV"]), tab.N * H),
                              w, u, k, G, gamma, None, hs, vn, None, tab.chunk_bos, tab.chunk_len, tab.seq_chunks,
                              tab.seq_sc, H=H, K=K, V=V, BL=BL, BK=next_pow2(K), NS=n, BTC=tab.BT, PREC=p, USE_G=ug)
        if name == "o_super":
            hsup()  # the states the output kernel reads (only here: every other job would tune this walk for nothing)
        o = q.new_empty(q.shape[0], H, V)
        calls["h_super"] = (cs.chunk_dp_fwd_kernel_h_super, hsup)
        calls["o_super"] = (cs.chunk_dp_fwd_kernel_o_super, lambda: launch(
            cs.chunk_dp_fwd_kernel_o_super, lambda m: (triton.cdiv(V, m["BV"]), tab.NSC, H),
            q, k, G, hs, vn, o, tab.chunk_bos, tab.sc_chunk0, tab.sc_len, sc, H=H, K=K, V=V, NH=n, BT=tab.BT,
            BTQ=query_tile(n * tab.BT, dtype), BL=BL, BK=next_pow2(K), NS=n, PREC=p))
    if name not in calls:
        return
    kernel, call = calls[name]
    at = autotuner(kernel)
    space = list(at.configs)

    def timed(tag, cfg):
        row = {"kernel": name, "n": n, "gated": gated, "config": tag, "in_space": cfg is None or any(
            label(c) == label(cfg) for c in space)}
        try:
            call()  # compile (and, for the autotuned row, tune) outside the lock
            with open(lock_path, "w") as lk:
                fcntl.flock(lk, fcntl.LOCK_EX)
                if dev == "cuda":
                    torch.cuda.synchronize()
                    row["ms"] = triton.testing.do_bench(call, warmup=10, rep=60, quantiles=[0.5])
                else:  # interpreter: one call, for the plumbing only
                    t1 = time.perf_counter()
                    call()
                    row["ms"] = (time.perf_counter() - t1) * 1e3
            if cfg is None:
                row["picked"] = label(at.best_config) if getattr(at, "best_config", None) else label(space[0])
        except Exception as e:  # noqa: BLE001 - out of resources and the like: this config is not a candidate
            row["error"] = f"{type(e).__name__}: {str(e)[:160]}"
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")

    timed("autotuned", None)
    for i, cfg in enumerate(candidates(name)):
        if i and time.time() - t0 > budget_s:  # the first candidate always runs: each kernel gets a pinned row
            break
        at.configs, at.cache = [cfg], {}
        timed(label(cfg), cfg)


def summary(rows):
    lines = ["| kernel | n_h | gated | autotuned ms (picked) | best candidate | best ms | autotuned / best |",
             "|---|---|---|---|---|---|---|"]
    keys = sorted({(r["kernel"], r["n"], r["gated"]) for r in rows}, key=lambda x: (KERNELS.index(x[0]), x[1], x[2]))
    for key in keys:
        rs = [r for r in rows if (r["kernel"], r["n"], r["gated"]) == key and "ms" in r]
        auto = next((r for r in rs if r["config"] == "autotuned"), None)
        cand = [r for r in rs if r["config"] != "autotuned"]
        if not cand:
            continue
        best = min(cand, key=lambda r: r["ms"])
        a = f"{auto['ms']:.3f} ({auto.get('picked', '?')})" if auto else "-"
        ratio = f"{auto['ms'] / best['ms']:.2f}" if auto else "-"
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {a} | {best['config']}{'' if best['in_space'] else ' (new)'}"
                     f" | {best['ms']:.3f} | {ratio} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--ns", default="1,2,3")
    ap.add_argument("--kernels", default=",".join(KERNELS))
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--budget-s", type=float, default=300, help="per process: candidates left after it are skipped")
    ap.add_argument("--small", action="store_true", help="a tiny shape (CPU interpreter test of the plumbing)")
    ap.add_argument("--job", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    out = os.path.join(args.out, "kernel_configs.jsonl")
    lock = os.path.join(args.out, ".kernel_configs.lock")
    if args.job:
        name, n, gated = args.job.split(":")
        job(name, int(n), gated == "1", out, lock, args.budget_s, args.small)
        return
    os.makedirs(args.out, exist_ok=True)
    todo = []
    for name in args.kernels.split(","):
        for n in [int(x) for x in args.ns.split(",")]:
            if name in ("h_super", "o_super") and n == 1:
                continue
            for gated in ((False, True) if name in ("dqkwg", "inv") else (False,)):
                todo.append(f"{name}:{n}:{int(gated)}")
    t0, running, rcs = time.time(), [], {}
    while todo or running:
        while todo and len(running) < args.jobs:
            j = todo.pop(0)
            running.append((j, subprocess.Popen([sys.executable, __file__, "--out", args.out, "--job", j,
                                                 "--budget-s", str(args.budget_s)] + ["--small"] * args.small)))
        time.sleep(1)
        for j, pr in list(running):
            if pr.poll() is not None:
                rcs[j] = pr.returncode
                running.remove((j, pr))
                print(f"[{time.time() - t0:6.1f}s] {j} rc={pr.returncode}", flush=True)
    rows = [json.loads(x) for x in open(out)] if os.path.exists(out) else []
    md = summary(rows)
    bad = {j: rc for j, rc in rcs.items() if rc != 0}
    md += "\n\nprocesses that did not exit cleanly: " + (", ".join(f"{j} rc={rc}" for j, rc in bad.items()) or "none")
    open(os.path.join(args.out, "kernel_configs.md"), "w").write(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
