"""Token-by-token DeltaProduct in Triton, for decoding (one or a few tokens, state in and out).

One program owns a [K, BV] slice of one (sequence, head) state in float32 registers and walks the tokens:
gate, n Householder steps, read-out. The state is read once and written once per call, so a decode step costs
about one pass over the state in memory. Forward only (decoding needs no gradients).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..utils import autotune_configs, contiguous, launch, next_pow2
from .naive import check_inputs


@triton.heuristics({"USE_INITIAL_STATE": lambda a: a["h0"] is not None,
                    "STORE_FINAL_STATE": lambda a: a["ht"] is not None,
                    "USE_G": lambda a: a["g"] is not None,
                    "IS_VARLEN": lambda a: a["cu_seqlens"] is not None})
# Configs measured on the H200 at batch 64, H=16, d=128 (graph-replayed step, benchmarks/kernels.py --decode-sweep):
# these five are within 15% of the best for n_h 1-3 (37-49 us); BV=64 with one warp (8-10x slower) and 8 warps
# (1.3-2x) are left out, so a noisy autotuning pass cannot pick them.
@triton.autotune(configs=autotune_configs([triton.Config({"BV": bv}, num_warps=w) for bv, w in
                                           ((16, 1), (16, 2), (32, 2), (32, 4), (64, 4))], default={"BV": 32},
                                          warps=2),
                 key=["H", "K", "V", "NH", "BK", "USE_L2NORM"])
@triton.jit(do_not_specialize=["T", "H"])
def fused_recurrent_dp_fwd_kernel(
    q, k, v, g, beta, o, h0, ht, cu_seqlens, scale, T,
    H, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_L2NORM: tl.constexpr, USE_G: tl.constexpr, USE_INITIAL_STATE: tl.constexpr,
    STORE_FINAL_STATE: tl.constexpr, IS_VARLEN: tl.constexpr,
):
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // H, i_nh % H
    if IS_VARLEN:
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    else:
        bos = i_n.to(tl.int64) * T
        eos = bos + T
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    o_kv = o_k[:, None] * V + o_v[None, :]
    b_h = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_INITIAL_STATE:
        b_h += tl.load(h0 + i_nh.to(tl.int64) * K * V + o_kv, mask=m_kv, other=0).to(tl.float32)
    for i_t in range(bos, eos):
        if USE_G:
            b_h *= tl.exp(tl.load(g + i_t * H + i_h).to(tl.float32))
        for j in range(NH):
            i_s = i_t * NH + j
            b_k = tl.load(k + (i_s * H + i_h) * K + o_k, mask=m_k, other=0).to(tl.float32)
            if USE_L2NORM:
                b_k = b_k / tl.sqrt(tl.sum(b_k * b_k) + 1e-6)
            b_v = tl.load(v + (i_s * H + i_h) * V + o_v, mask=m_v, other=0).to(tl.float32)
            b_b = tl.load(beta + i_s * H + i_h).to(tl.float32)
            b_err = b_v - tl.sum(b_h * b_k[:, None], 0)
            b_h += (b_b * b_k)[:, None] * b_err[None, :]
        b_q = tl.load(q + (i_t * H + i_h) * K + o_k, mask=m_k, other=0).to(tl.float32)
        if USE_L2NORM:
            b_q = b_q / tl.sqrt(tl.sum(b_q * b_q) + 1e-6)
        b_o = tl.sum(b_h * (b_q * scale)[:, None], 0)
        tl.store(o + (i_t * H + i_h) * V + o_v, b_o.to(o.dtype.element_ty), mask=m_v)
    if STORE_FINAL_STATE:
        tl.store(ht + i_nh.to(tl.int64) * K * V + o_kv, b_h.to(ht.dtype.element_ty), mask=m_kv)


@contiguous
def _fused_recurrent_fwd(q, k, v, g, beta, n, scale, initial_state, output_final_state, l2norm, cu_seqlens):
    B, T, H, K = q.shape
    V = v.shape[-1]
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    o = q.new_empty(B, T, H, V)
    ht = q.new_empty(N, H, K, V, dtype=torch.float32) if output_final_state else None
    grid = lambda meta: (triton.cdiv(V, meta["BV"]), N * H)
    launch(fused_recurrent_dp_fwd_kernel, grid,
        q, k, v, g, beta, o, initial_state, ht, cu_seqlens, scale, T,
        H=H, K=K, V=V, NH=n, BK=next_pow2(K), USE_L2NORM=l2norm)
    return o, ht


@torch.compiler.disable
def fused_recurrent_gated_delta_product(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
    *,
    num_householder: int = 1,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Recurrent (Gated) DeltaProduct with fla's argument names (no gradients). beta None means all ones. fla has no
    such function (its fused_recurrent_gated_delta_rule puts gk, gv between g and beta), so everything after beta
    is keyword-only: a positional num_householder cannot land on another parameter.
    Returns (o [B,T,H,V] in q's dtype, final state [N,H,K,V] float32 or None)."""
    if beta is None:
        beta = q.new_ones(k.shape[:-1])
    check_inputs(q, k, v, g, beta, num_householder, initial_state, cu_seqlens)
    if q.requires_grad or k.requires_grad or v.requires_grad:
        raise ValueError("fused_recurrent_gated_delta_product: forward only; use chunk_gated_delta_product to train")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return _fused_recurrent_fwd(q, k, v, g, beta, num_householder, scale, initial_state, output_final_state,
                                use_qk_l2norm_in_kernel, cu_seqlens)
