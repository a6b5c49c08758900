"""Prototype: the forward's output over super-chunks in fla's layout (one 64 x 64 block per Householder step).

    python3 benchmarks/out_proto.py --out DIR [--ns 2,3] [--gated 0,1]      # one CUDA GPU, ~1-2 minutes
    ncu --profile-from-start off --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section WarpStateStats --section LaunchStats --section Occupancy -o DIR/ncu \
        python3 benchmarks/out_proto.py --out DIR --ns 3 --gated 0 --ncu    # the same kernels once each, under ncu
    ncu --import DIR/ncu.ncu-rep --page details > DIR/ncu.txt             # (ncu: PATH or /opt/nvidia/nsight-compute/*/)

Why (BENCHMARKS.md, session 14): at B=4 T=4096 H=16 d=128 bf16, n_h 3, our output kernel `chunk_dp_fwd_o` reads one
[K, V] state per 64-step chunk (21 tokens) and takes 0.300 ms, fla's `chunk_gated_delta_product_fwd_o` reads one per
64 *tokens* and takes 0.202; the super-chunk path (`DPX_KERNEL_FWD=super`, kernels/delta_product/chunk_super.py)
has fla's state bytes but its output kernel took 0.348 (session 8). fla computes, per 64-token block and for each
Householder step i of a token, one [64 q tokens] x [64 key tokens] block against a token-level causal mask and a
decay matrix formed once; chunk_super's kernel instead takes each of its n chunks' 64 interleaved steps as a block
and forms the mask and decay per chunk. This file is fla's scheme on dpx's chunk table and tensors:

  out_tok_kernel   per super-chunk s (n consecutive chunks of one sequence, <= 64 tokens), V slice, head:
      o_t = scale * (exp(Gq_t) q_t h_s + sum_{i < n} sum_{tokens u <= t} exp(Gq_t - Gq_u) (q_t . k_{u,i}) v_new_{u,i})
      k_{u,i} = k[(bos_u) * n + i] (the interleaved keys, as stored), v_new_{u,i} = v_new[chunk of u, (u % BT) * n + i]
      (the walk's corrected values, per chunk), Gq = the token-level log gate cumsum from the super-chunk's start.
      The gate enters at a token's first step, so every step of token u has the log gate Gq_u: one decay matrix
      serves all n steps (fla's b_m). The sum is exact for the same reason as chunk_super's (its docstring).

The state walk is chunk_super's (`chunk_dp_fwd_kernel_h_super`: one state per super-chunk), so `fwd_h_o_tok`
returns what `chunk_dp_fwd_h_o_super` returns. main() times, in one process and on the same inputs: dpx's default
fwd_h + fwd_o, the super pair, the super walk + out_tok, and fla's fwd_h and fwd_o (same-run anchors), each kernel
alone and autotuned, and checks out_tok against the default path's output.

Nothing here is used by dpx's kernels; kernels/ is untouched. Imports: torch, triton and dpx.kernels (and
benchmarks/kernels.py for its inputs and fla's stage timings).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
try:
    import dpx.kernels  # noqa: F401
except ImportError:  # repo checkout without `pip install -e .`: expose kernels/ as dpx.kernels
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from dpx_checkout import expose_kernels
    expose_kernels()

from dpx.kernels.delta_product.index import BL, ChunkTable, query_tile  # noqa: E402
from dpx.kernels.utils import autotune_configs, autotuner, launch, next_pow2  # noqa: E402

CONFIGS = [triton.Config({"BV": bv}, num_warps=w, num_stages=s) for bv in (64, 128) for w in (4, 8) for s in (1, 2, 3)]


@triton.heuristics({"USE_G": lambda a: a["G"] is not None})
@triton.autotune(configs=autotune_configs(CONFIGS, default={"BV": 64}), key=["H", "K", "V", "NH", "KT", "PREC",
                                                                             "USE_G"])
@triton.jit(do_not_specialize=["H"])
def out_tok_kernel(
    q, k, G, h, v_new, o, chunk_bos, sc_chunk0, sc_len, scale,
    H, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr, BT: tl.constexpr, BTQ: tl.constexpr, BL: tl.constexpr,
    KT: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr, USE_G: tl.constexpr,
):
    # BT: tokens of a full chunk; BTQ: query (and key-token) rows, a power of two >= NH * BT; NH chunks a super-chunk;
    # KT: the K tile (64, or the next power of two >= 16 for K <= 32)
    i_v, i_s, i_h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    c0 = tl.load(sc_chunk0 + i_s).to(tl.int64)
    n_tok = tl.load(sc_len + i_s)
    bos = tl.load(chunk_bos + c0).to(tl.int64)  # the super-chunk's chunks hold consecutive tokens from here
    o_t = tl.arange(0, BTQ)
    o_v = i_v * BV + tl.arange(0, BV)
    m_t, m_v = o_t < n_tok, o_v < V
    j_t = o_t // BT  # each token's chunk within the super-chunk
    r_t = o_t % BT   # and its row of tokens there

    # q h over K in KT-wide tiles (a loop, not unrolled: fla's layout, which keeps the registers of one tile pair)
    b_o = tl.zeros([BTQ, BV], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, KT)):
        o_k = i_k * KT + tl.arange(0, KT)
        m_k = o_k < K
        b_q = tl.load(q + ((bos + o_t[:, None]) * H + i_h) * K + o_k[None, :], mask=m_t[:, None] & m_k[None, :],
                      other=0)
        b_h = tl.load(h + (i_s.to(tl.int64) * H + i_h) * K * V + o_k[:, None] * V + o_v[None, :],
                      mask=m_k[:, None] & m_v[None, :], other=0)
        b_o = tl.dot(b_q, b_h.to(b_q.dtype), b_o, input_precision=PREC)
    m_A = (o_t[:, None] >= o_t[None, :]) & m_t[:, None] & m_t[None, :]  # token u <= t, both real
    if USE_G:
        # token-level log gate from the super-chunk's start: the chunk's own cumsum at the token's last step, plus the
        # totals (row BL - 1) of the chunks before it
        b_Gq = tl.load(G + ((c0 + j_t) * H + i_h) * BL + r_t * NH + NH - 1, mask=m_t, other=0)
        for j in tl.static_range(NH):
            b_gl = tl.load(G + ((c0 + j) * H + i_h) * BL + BL - 1, mask=j * BT < n_tok, other=0)
            b_Gq += tl.where(j_t > j, b_gl, 0)
        b_Gq = tl.where(m_t, b_Gq, 0)  # padding rows: no overflow in exp
        b_o = b_o * tl.exp(b_Gq)[:, None]
        b_m = tl.where(m_A, tl.exp(tl.where(m_A, b_Gq[:, None] - b_Gq[None, :], 0)), 0)
    else:
        b_m = m_A.to(tl.float32)
    p_v0 = v_new + (((c0 + j_t) * H + i_h) * BL + r_t * NH)[:, None] * V + o_v[None, :]
    for i in range(NH):
        # step i of every token: its key (interleaved rows of k, loaded K-major) and its corrected value (row
        # r_t * NH + i of its chunk)
        b_A = tl.zeros([BTQ, BTQ], dtype=tl.float32)
        for i_k in range(tl.cdiv(K, KT)):
            o_k = i_k * KT + tl.arange(0, KT)
            m_k = o_k < K
            b_q = tl.load(q + ((bos + o_t[:, None]) * H + i_h) * K + o_k[None, :], mask=m_t[:, None] & m_k[None, :],
                          other=0)
            b_kT = tl.load(k + (((bos + o_t[None, :]) * NH + i) * H + i_h) * K + o_k[:, None],
                           mask=m_k[:, None] & m_t[None, :], other=0)
            b_A = tl.dot(b_q, b_kT, b_A, input_precision=PREC)
        b_A = b_A * b_m
        b_vn = tl.load(p_v0 + i * V, mask=m_t[:, None] & m_v[None, :], other=0)
        b_o = tl.dot(b_A.to(b_vn.dtype), b_vn, b_o, input_precision=PREC)
    p_o = o + ((bos + o_t[:, None]) * H + i_h) * V + o_v[None, :]
    tl.store(p_o, (b_o * scale).to(o.dtype.element_ty), mask=m_t[:, None] & m_v[None, :])


def out_tok(q, k, G, h, v_new, tab: ChunkTable, scale: float, prec: str, gated: bool):
    """q [NTOK,H,K], k [NTOK*n,H,K], G [NC,H,BL] (chunk_dp_fwd_inv's), h [NSC,H,K,V] (one state per super-chunk),
    v_new [NC,H,BL,V] -> o [NTOK,H,V] (q's dtype). `gated`: whether G holds gates (False: all zero, skipped)."""
    NTOK, H, K = q.shape
    V = v_new.shape[-1]
    o = q.new_empty(NTOK, H, V)
    launch(out_tok_kernel, lambda meta: (triton.cdiv(V, meta["BV"]), tab.NSC, H),
           q, k, G if gated else None, h, v_new, o, tab.chunk_bos, tab.sc_chunk0, tab.sc_len, scale, H=H, K=K, V=V,
           NH=tab.n, BT=tab.BT, BTQ=query_tile(tab.n * tab.BT, q.dtype), BL=BL, KT=min(64, max(16, next_pow2(K))),
           PREC=prec)
    return o


def fwd_h_super(w, u, k, G, gamma, h0, tab: ChunkTable, output_final_state: bool, state_dtype, prec: str,
                gated: bool):
    """chunk_super's walk alone: h [NSC,H,K,V] (state_dtype), v_new [NC,H,BL,V], ht [N,H,K,V] float32 or None."""
    from dpx.kernels.delta_product.chunk_super import chunk_dp_fwd_kernel_h_super
    NC, H, _, K = w.shape
    V = u.shape[-1]
    h = w.new_empty(tab.NSC, H, K, V, dtype=state_dtype)
    v_new = torch.empty_like(u)
    ht = w.new_empty(tab.N, H, K, V, dtype=torch.float32) if output_final_state else None
    launch(chunk_dp_fwd_kernel_h_super, lambda meta: (triton.cdiv(V, meta["BV"]), tab.N * H),
           w, u, k, G, gamma, h0, h, v_new, ht, tab.chunk_bos, tab.chunk_len, tab.seq_chunks, tab.seq_sc, H=H, K=K,
           V=V, BL=BL, BK=next_pow2(K), NS=tab.n, BTC=tab.BT, PREC=prec, USE_G=gated)
    return h, v_new, ht


def fwd_h_o_tok(q, k, w, u, gamma, G, h0, tab: ChunkTable, scale: float, output_final_state: bool, prec: str,
                gated: bool):
    """chunk_super.chunk_dp_fwd_h_o_super's signature and results, with out_tok as the output kernel."""
    h, v_new, ht = fwd_h_super(w, u, k, G, gamma, h0, tab, output_final_state, q.dtype, prec, gated)
    return out_tok(q, k, G, h, v_new, tab, scale, prec, gated), ht


# -- GPU timing ------------------------------------------------------------------------------------------------------

B, T, H, D = 4, 4096, 16, 128


def _kernels_module():
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:  # loaded by path (the tests): its sibling dpx_checkout too
        sys.path.insert(0, here)
    from dpx_checkout import load_script
    return load_script(os.path.join(here, "kernels.py"), "dpx_bench_kernels")


def _err(ref, out) -> dict:
    ref, out = ref.double(), out.double()
    d = (out - ref).abs()
    return {"max_rel": (d.max() / ref.abs().max().clamp_min(1e-30)).item(),
            "rms_rel": (d.norm() / ref.norm().clamp_min(1e-30)).item()}


def label(cfg) -> str:
    return " ".join([f"{k}={v}" for k, v in cfg.kwargs.items()] + [f"w={cfg.num_warps}", f"s={cfg.num_stages}"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--ns", default="2,3")
    ap.add_argument("--gated", default="0,1")
    ap.add_argument("--no-fla", action="store_true", help="skip fla's stage timings")
    ap.add_argument("--autotune-cache", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                             "kernels_h200_s7", "fla_autotune_cache_h200_triton360.tgz"),
                    help="a tar of fla's autotune results for this shape (kernels.py's): unpacked into the Triton "
                         "cache first, so fla does not spend minutes tuning ('' or a missing file: fla tunes)")
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU (TRITON_INTERPRET=1): tiny float32 shapes, one untimed-quality call per kernel, no fla "
                         "(tests/test_out_proto.py runs main() this way)")
    ap.add_argument("--ncu", action="store_true",
                    help="after the timings, run each kernel once inside torch.cuda.profiler.start/stop (for "
                         "`ncu --profile-from-start off`)")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    global B, T, H, D
    if a.dry_run:
        B, T, H, D = 1, 50, 1, 16
        dev, dtype, a.no_fla, a.ncu = "cpu", torch.float32, True, False
    elif not torch.cuda.is_available():
        sys.exit("out_proto: needs a CUDA device (or --dry-run under TRITON_INTERPRET=1)")
    else:
        dev, dtype = "cuda", torch.bfloat16
    from dpx.kernels.delta_product.chunk_h import chunk_dp_fwd_h, chunk_dp_fwd_kernel_h
    from dpx.kernels.delta_product.chunk_o import chunk_dp_fwd_kernel_o, chunk_dp_fwd_o
    from dpx.kernels.delta_product.chunk_super import (chunk_dp_fwd_kernel_h_super, chunk_dp_fwd_kernel_o_super,
                                                       chunk_dp_fwd_h_o_super)
    km = _kernels_module()  # (sets TRITON_CACHE_AUTOTUNING=1 before it imports fla)
    if not a.dry_run and not a.no_fla and a.autotune_cache and os.path.exists(a.autotune_cache):
        import tarfile
        with tarfile.open(a.autotune_cache) as tf:
            tf.extractall(km.triton_cache_dir(), filter="data")
    t0 = time.time()
    if a.dry_run:
        def bench(fn):
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e3
        bw = mm = float("nan")
    else:
        bench = lambda fn: triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")
        bw, mm = km.measured_rates(torch.device("cuda"))
    out = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu (interpreter)",
           "triton": triton.__version__, "torch": torch.__version__,
           "shape": {"B": B, "T": T, "H": H, "K": D, "V": D, "dtype": str(dtype).replace("torch.", "")},
           "copy_TBps": bw / 1e12, "matmul_TFLOPs": mm / 1e12, "cases": []}
    tuned = (chunk_dp_fwd_kernel_h, chunk_dp_fwd_kernel_o, chunk_dp_fwd_kernel_h_super, chunk_dp_fwd_kernel_o_super,
             out_tok_kernel)
    last = None
    for gd in a.gated.split(","):
        for n in map(int, a.ns.split(",")):
            gated = bool(int(gd))
            for kern in tuned:  # each case tunes at its own shape
                autotuner(kern).cache = {}
            x = km.stage_inputs(B, T, H, D, D, n, gated, dtype, dev)
            q, k, tab, sc, p = x["q"], x["k"], x["tab"], x["sc"], x["p"]
            w, u, gamma, G = x["w"], x["u"], x["gamma"], x["G"]
            h, vn, _ = chunk_dp_fwd_h(w, u, k, G, gamma, None, tab, False, q.dtype, p, gated)
            ref = chunk_dp_fwd_o(q, k, G, h, vn, tab, sc, p)
            o_super, _ = chunk_dp_fwd_h_o_super(q, k, w, u, gamma, G, None, tab, sc, False, p, gated)
            hs, vns, _ = fwd_h_super(w, u, k, G, gamma, None, tab, False, q.dtype, p, gated)
            o_tok = out_tok(q, k, G, hs, vns, tab, sc, p, gated)
            if dev == "cuda":
                torch.cuda.synchronize()
            case = {"n_h": n, "gated": gated, "NC": tab.NC, "NSC": tab.NSC,
                    "tok_vs_default": _err(ref, o_tok), "super_vs_default": _err(ref, o_super)}
            ms = {
                "fwd_h (per chunk)": bench(lambda: chunk_dp_fwd_h(w, u, k, G, gamma, None, tab, False, q.dtype, p,
                                                                  gated)),
                "fwd_o (per chunk)": bench(lambda: chunk_dp_fwd_o(q, k, G, h, vn, tab, sc, p)),
                "h_super": bench(lambda: fwd_h_super(w, u, k, G, gamma, None, tab, False, q.dtype, p, gated)),
                "o_super": bench(lambda: chunk_dp_fwd_h_o_super(q, k, w, u, gamma, G, None, tab, sc, False, p,
                                                                gated)),
                "out_tok": bench(lambda: out_tok(q, k, G, hs, vns, tab, sc, p, gated)),
            }
            ms["o_super"] -= ms["h_super"]  # chunk_dp_fwd_h_o_super runs both kernels
            ms["default walk + output"] = ms["fwd_h (per chunk)"] + ms["fwd_o (per chunk)"]
            ms["super walk + out_tok"] = ms["h_super"] + ms["out_tok"]
            case["ms"] = ms
            case["picks"] = {getattr(getattr(autotuner(kern), "base_fn", None), "__name__", repr(kern)):
                             label(autotuner(kern).best_config)
                             for kern in tuned if getattr(autotuner(kern), "best_config", None) is not None}
            if not a.no_fla and km.fla_chunk is not None:
                try:
                    case["fla_ms"] = km.fla_stage_times(B, T, H, D, D, n, gated, torch.bfloat16, "cuda")
                except Exception as e:  # noqa: BLE001 - fla is optional
                    case["fla_ms"] = {"error": f"{type(e).__name__}: {str(e)[:120]}"}
            out["cases"].append(case)
            print(f"[{time.time() - t0:5.1f}s] n_h={n} gated={gated}: " + ", ".join(f"{kk} {vv:.3f}" for kk, vv in
                  ms.items()) + f"; fla {case.get('fla_ms')}; out_tok vs default {case['tok_vs_default']}",
                  flush=True)
            with open(os.path.join(a.out, "out_proto.json"), "w") as f:
                json.dump(out, f, indent=1)
            last = (q, k, w, u, gamma, G, tab, sc, p, h, vn, hs, vns, gated)
    if a.ncu and last is not None:  # the last case's kernels, once each, inside the profiled range
        q, k, w, u, gamma, G, tab, sc, p, h, vn, hs, vns, gated = last
        fla = km.fla_forward_stages(B, T, H, D, D, tab.n, gated, torch.bfloat16, "cuda") \
            if not a.no_fla and km.fla_chunk is not None else None
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        chunk_dp_fwd_h(w, u, k, G, gamma, None, tab, False, q.dtype, p, gated)
        chunk_dp_fwd_o(q, k, G, h, vn, tab, sc, p)
        fwd_h_super(w, u, k, G, gamma, None, tab, False, q.dtype, p, gated)
        out_tok(q, k, G, hs, vns, tab, sc, p, gated)
        if fla is not None:  # fla's walk and output (its preparation is not what this file studies)
            fla["fwd_h"]()
            fla["fwd_o"]()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
