"""The per-chunk gradients of chunk_bwd.chunk_dp_bwd_kernel_dqkwg as two kernels (fla's split; opt-in).

The fused kernel keeps five float32 accumulators live across its loop over V and spills at head dim 128. fla cuts
the same work in two (fla/ops/common/chunk_o.py chunk_bwd_kernel_dqkwg, then a WY backward, as
gated_delta_rule/wy_fast.py prepare_wy_repr_bwd_kernel); so does this module, with DeltaProduct's notation
(chunk_bwd's docstring):
  chunk_dp_bwd_kernel_dqkw   grid (chunks x K blocks, heads); loops over V for one BK = 64 slice of K:
                             dq (complete), dk_o = dKd e^{G_L-G} + D^T Q (the output/state part, float32, in a
                             [NC, H, BL, K] buffer), dW = -dv_new S^T (k's dtype: the fused kernel rounds it to that
                             before its two products as well) and the gate gradient's Kd/gamma/P/e^Gq terms, summed
                             per step for this K slice ([NC, H, NK, BL] float32)
  chunk_dp_bwd_kernel_wy     grid (chunks, heads); from dW, dU = dv_new, T, k, v, beta, G: dv, dbeta, dk = dk_o +
                             T^T dW (beta e^G) + (Bm + Bm^T) k, and dg (the A and X terms plus the first kernel's
                             partials, then the reverse in-chunk cumsum). K is walked in 64-wide slices twice (dT
                             needs all of K before dA exists, and dk needs dA), so only [64, 64] tiles stay live.
The first kernel works in the step-major orientation (dO S^T and dO v_new^T accumulated transposed, dq stored
through transposed pointers), so it transposes no dot result and needs no scratch; the second transposes
Bm = dA E beta through a [64, 64] scratch slot per chunk with debug barriers, as the fused kernel does (Triton
>= 3.4 on Hopper miscompiles tl.trans of a dot result fed to another dot: fla PR #826).
What the split costs in traffic, per chunk and head: dk_o (float32) and dW written and read back, v_new, dv_new and
dO read once per K slice (twice at head dim 128), dv_new and k read again by the WY kernel (k twice). What it buys
(benchmarks/kernel_resources.py, sm_90, bf16, d = 128, n_h = 2, gated): spills of 768 B (4 warps) / 68 B (8 warps)
and 500 B / 0 B per thread in the two kernels, against the fused kernel's 8.5 KB / 2.6 KB. Not yet run on a GPU.
Selected by DPX_KERNEL_DQKWG=split (chunk.dqkwg_kernel); the fused kernel stays the default.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..utils import autotune_configs, launch
from .chunk_bwd import DQKWG_MIN_TILE
from .index import BL, ChunkTable


@triton.autotune(configs=autotune_configs([triton.Config({}, num_warps=w, num_stages=s) for w in (4, 8)
                                           for s in (1, 2)]),
                 key=["H", "K", "V", "NH", "BK", "BV", "USE_G", "PREC"])
@triton.jit(do_not_specialize=["H"])  # H is a runtime stride: one binary for every head count
def chunk_dp_bwd_kernel_dqkw(
    q, k, G, h, dh, v_new, dv_new, do, dq, dko, dw, dgp, chunk_bos, chunk_len, scale,
    H, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr, BT: tl.constexpr, BL: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, USE_G: tl.constexpr, PREC: tl.constexpr,
):
    NK: tl.constexpr = tl.cdiv(K, BK)
    # the K blocks of one chunk are neighbours in the grid (they read the same v_new, dv_new, dO slices)
    i_ck, i_h = tl.program_id(0), tl.program_id(1)
    i_c, i_k = i_ck // NK, i_ck % NK
    i_ch = i_c.to(tl.int64) * H + i_h
    bos = tl.load(chunk_bos + i_c).to(tl.int64)
    n_t = tl.load(chunk_len + i_c)
    o_t = tl.arange(0, BT)
    o_l = tl.arange(0, BL)
    o_k = i_k * BK + tl.arange(0, BK)
    m_t, m_l, m_k = o_t < n_t, o_l < n_t * NH, o_k < K
    dt = k.dtype.element_ty
    b_q = tl.load(q + ((bos + o_t[:, None]) * H + i_h) * K + o_k[None, :], mask=m_t[:, None] & m_k[None, :], other=0)
    b_k = tl.load(k + ((bos * NH + o_l[:, None]) * H + i_h) * K + o_k[None, :], mask=m_l[:, None] & m_k[None, :],
                  other=0)
    b_G = tl.load(G + i_ch * BL + o_l)
    b_Gq = tl.load(G + i_ch * BL + o_t * NH + NH - 1, mask=m_t, other=0)

    # sums over V (four float32 accumulators, the [*, BK] ones for one 64-wide slice of K)
    b_dqT = tl.zeros([BK, BT], dtype=tl.float32)   # (dO S^T)^T = S dO^T
    b_dPT = tl.zeros([BL, BT], dtype=tl.float32)   # (dO v_new^T)^T = v_new dO^T
    b_dk = tl.zeros([BL, BK], dtype=tl.float32)    # first dKd = v_new dS_next^T, then dk_o
    b_dw = tl.zeros([BL, BK], dtype=tl.float32)    # -dv_new S^T
    b_dgam = tl.zeros([BK], dtype=tl.float32)      # sum(S * dS_next), per row of S
    for i_v in range(0, tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        p_kv = i_ch * K * V + o_k[:, None] * V + o_v[None, :]
        p_lv = i_ch * BL * V + o_l[:, None] * V + o_v[None, :]
        b_h = tl.load(h + p_kv, mask=m_k[:, None] & m_v[None, :], other=0)
        b_dh = tl.load(dh + p_kv, mask=m_k[:, None] & m_v[None, :], other=0)
        b_vn = tl.load(v_new + p_lv, mask=m_v[None, :], other=0)
        b_dvn = tl.load(dv_new + p_lv, mask=m_v[None, :], other=0)
        # dO^T [BV, BT], loaded transposed
        b_doT = tl.load(do + ((bos + o_t[None, :]) * H + i_h) * V + o_v[:, None], mask=m_v[:, None] & m_t[None, :],
                        other=0).to(dt)
        b_dqT += tl.dot(b_h, b_doT, input_precision=PREC)
        b_dPT += tl.dot(b_vn, b_doT, input_precision=PREC)
        b_dk += tl.dot(b_vn, tl.trans(b_dh), input_precision=PREC)
        b_dw -= tl.dot(b_dvn, tl.trans(b_h), input_precision=PREC)
        b_dgam += tl.sum(b_h.to(tl.float32) * b_dh.to(tl.float32), 1)
    if USE_G:  # q . (dO S^T) per token (for the e^Gq term), before the accumulator is scaled into dq
        b_qdq = tl.sum(tl.trans(b_q).to(tl.float32) * b_dqT, 0)
    # dW in k's dtype (the fused kernel rounds it there too, before dT += dW X^T and dX = T^T dW)
    p_lk = i_ch * BL * K + o_l[:, None] * K + o_k[None, :]
    tl.store(dw + p_lk, b_dw.to(dw.dtype.element_ty), mask=m_k[None, :])

    # state update: Kd = e^{G_L-G} K, gamma = e^{G_L}; b_dk holds dKd so far
    b_GL = tl.sum(tl.where(o_l == BL - 1, b_G, 0), 0)
    b_ed = tl.exp(b_GL - b_G)
    b_kdk = tl.sum(b_dk * b_k.to(tl.float32), 1) * b_ed   # dKd_s . Kd_s over this K slice, for the gate gradient
    b_dk = b_dk * b_ed[:, None]
    # output: o = scale (e^Gq Q S + P v_new); D^T = dP^T * mask * decay, so dq^T += K^T D^T, dk += D^T Q
    m_s = (o_l[:, None] <= (o_t * NH + NH - 1)[None, :]) & m_t[None, :]  # padding tokens: Gq = 0 would overflow
    b_DT = tl.where(m_s, b_dPT * tl.exp(tl.where(m_s, b_Gq[None, :] - b_G[:, None], 0)), 0) * scale
    b_eGq = tl.exp(b_Gq)
    b_DTc = b_DT.to(dt)
    b_dq = b_dqT * (scale * b_eGq)[None, :] + tl.dot(tl.trans(b_k), b_DTc, input_precision=PREC)
    tl.store(dq + ((bos + o_t[None, :]) * H + i_h) * K + o_k[:, None], b_dq.to(dq.dtype.element_ty),
             mask=m_k[:, None] & m_t[None, :])
    b_dk += tl.dot(b_DTc, b_q, input_precision=PREC)
    tl.store(dko + p_lk, b_dk, mask=m_k[None, :])

    if USE_G:
        # this K slice's share of dG_s from Kd and gamma (at G_L), P (R^T = D^T * K Q^T) and e^Gq (at i_t)
        b_RT = b_DT * tl.dot(b_k, tl.trans(b_q), input_precision=PREC)
        b_dG = -tl.sum(b_RT, 1) - b_kdk
        b_dG += tl.where(o_l == BL - 1, tl.sum(b_kdk, 0) + tl.sum(b_dgam, 0) * tl.exp(b_GL), 0)
        b_dGq = scale * b_eGq * b_qdq + tl.sum(b_RT, 0)
        b_dG += tl.sum(tl.where(o_l[:, None] == (o_t * NH + NH - 1)[None, :], b_dGq[None, :], 0), 1)
        tl.store(dgp + (i_ch * NK + i_k) * BL + o_l, b_dG)


@triton.autotune(configs=autotune_configs([triton.Config({}, num_warps=w, num_stages=s) for w in (4, 8)
                                           for s in (1, 2)]),
                 key=["H", "K", "V", "NH", "BK", "BV", "USE_G", "PREC"])
@triton.jit(do_not_specialize=["H"])  # H is a runtime stride: one binary for every head count
def chunk_dp_bwd_kernel_wy(
    k, v, beta, G, t, s, dw, dv_new, dko, dgp, dk, dv, dbeta, dg, chunk_bos, chunk_len,
    H, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr, BL: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, USE_G: tl.constexpr, PREC: tl.constexpr,
):
    NK: tl.constexpr = tl.cdiv(K, BK)
    i_c, i_h = tl.program_id(0), tl.program_id(1)
    i_ch = i_c.to(tl.int64) * H + i_h
    bos = tl.load(chunk_bos + i_c).to(tl.int64)
    n_t = tl.load(chunk_len + i_c)
    o_l = tl.arange(0, BL)
    m_l = o_l < n_t * NH
    dt = k.dtype.element_ty
    b_b = tl.load(beta + (bos * NH + o_l) * H + i_h, mask=m_l, other=0).to(tl.float32)
    b_G = tl.load(G + i_ch * BL + o_l)
    b_eG = tl.exp(b_G)
    b_xs = b_b * b_eG   # X = diag(beta e^G) K
    # T^T, loaded transposed (the backward only ever multiplies by T^T); its upper triangle was never written
    b_Tt = tl.load(t + i_ch * BL * BL + o_l[None, :] * BL + o_l[:, None], mask=o_l[None, :] >= o_l[:, None], other=0)

    # U = T Y, Y = diag(beta) V:  dY = T^T dU, dv = beta dY, dbeta += dY . v, dT += dU Y^T
    b_dT = tl.zeros([BL, BL], dtype=tl.float32)
    b_db = tl.zeros([BL], dtype=tl.float32)
    for i_v in range(0, tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        b_dvn = tl.load(dv_new + i_ch * BL * V + o_l[:, None] * V + o_v[None, :], mask=m_v[None, :], other=0)
        p_v = ((bos * NH + o_l[:, None]) * H + i_h) * V + o_v[None, :]
        b_v = tl.load(v + p_v, mask=m_l[:, None] & m_v[None, :], other=0)
        b_dY = tl.dot(b_Tt, b_dvn, input_precision=PREC)
        tl.store(dv + p_v, (b_dY * b_b[:, None]).to(dv.dtype.element_ty), mask=m_l[:, None] & m_v[None, :])
        b_db += tl.sum(b_dY * b_v.to(tl.float32), 1)
        b_dT += tl.dot(b_dvn, tl.trans((b_v * b_b[:, None]).to(dt)), input_precision=PREC)
    # W = T X:  dT += dW X^T, dX = T^T dW (dbeta and dG need dX . k); and A's K K^T, over 64-wide slices of K
    b_KK = tl.zeros([BL, BL], dtype=tl.float32)
    b_xk = tl.zeros([BL], dtype=tl.float32)
    for i_k in range(0, NK):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_k = tl.load(k + ((bos * NH + o_l[:, None]) * H + i_h) * K + o_k[None, :], mask=m_l[:, None] & m_k[None, :],
                      other=0)
        b_dw = tl.load(dw + i_ch * BL * K + o_l[:, None] * K + o_k[None, :], mask=m_k[None, :], other=0)
        b_dT += tl.dot(b_dw, tl.trans((b_k * b_xs[:, None]).to(dt)), input_precision=PREC)
        b_dX = tl.dot(b_Tt, b_dw, input_precision=PREC)
        b_xk += tl.sum(b_dX * b_k.to(tl.float32), 1)
        b_KK += tl.dot(b_k, tl.trans(b_k), input_precision=PREC)
    # T = (I+A)^-1: dA = -T^T dT T^T on the strict lower triangle; A = diag(beta) (K K^T * E)
    m_a = o_l[:, None] > o_l[None, :]
    b_dA = tl.dot(tl.dot(b_Tt, b_dT.to(dt), input_precision=PREC).to(dt), b_Tt, input_precision=PREC)
    b_E = tl.where(m_a, tl.exp(tl.where(m_a, b_G[:, None] - b_G[None, :], 0)), 0)
    b_dA = tl.where(m_a, -b_dA, 0)
    b_KK = b_KK * b_E
    b_db += b_xk * b_eG + tl.sum(b_dA * b_KK, 1)
    tl.store(dbeta + (bos * NH + o_l) * H + i_h, b_db.to(dbeta.dtype.element_ty), mask=m_l)
    # A_ij = beta_i e^{G_i-G_j} k_i.k_j: dk_i += sum_j Bm_ij k_j and dk_j += sum_i Bm_ij k_i, one product with
    # Bm + Bm^T (strictly lower + strictly upper: the sum rounds nothing); Bm^T through memory, as in the fused kernel
    b_Bm = (b_dA * b_E * b_b[:, None]).to(dt)
    p_s = s + i_ch * BL * BL
    tl.debug_barrier()
    tl.store(p_s + o_l[:, None] * BL + o_l[None, :], b_Bm)
    tl.debug_barrier()
    b_Bm += tl.load(p_s + o_l[:, None] + o_l[None, :] * BL)
    for i_k in range(0, NK):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        p_k = ((bos * NH + o_l[:, None]) * H + i_h) * K + o_k[None, :]
        p_lk = i_ch * BL * K + o_l[:, None] * K + o_k[None, :]
        b_k = tl.load(k + p_k, mask=m_l[:, None] & m_k[None, :], other=0)
        b_dw = tl.load(dw + p_lk, mask=m_k[None, :], other=0)
        b_dX = tl.dot(b_Tt, b_dw, input_precision=PREC)   # recomputed: cheaper than keeping [BL, K] live
        b_dk = tl.load(dko + p_lk, mask=m_k[None, :], other=0) + b_dX * b_xs[:, None]
        b_dk += tl.dot(b_Bm, b_k, input_precision=PREC)
        tl.store(dk + p_k, b_dk.to(dk.dtype.element_ty), mask=m_l[:, None] & m_k[None, :])

    if USE_G:
        # dG_s from A (M = dA * A) and X, plus the first kernel's Kd/gamma/P/e^Gq terms (one row per K slice)
        b_M = b_dA * b_KK * b_b[:, None]
        b_dG = tl.sum(b_M, 1) - tl.sum(b_M, 0) + b_xs * b_xk
        for i_k in range(0, NK):
            b_dG += tl.load(dgp + (i_ch * NK + i_k) * BL + o_l)
        # G = in-chunk cumsum of the per-step log gate (g_t on step t*n): dg_t = sum_{s >= t*n} dG_s
        b_dgi = tl.cumsum(b_dG, 0, reverse=True)
        tl.store(dg + (bos + o_l // NH) * H + i_h, b_dgi, mask=m_l & (o_l % NH == 0))


def chunk_dp_bwd_dqkw(q, k, G, h, dh, v_new, dv_new, do, tab: ChunkTable, scale: float, use_g: bool, prec: str):
    """The K-blocked half. Returns dq (q's dtype), dk_o [NC,H,BL,K] float32, dW [NC,H,BL,K] in k's dtype and the
    gate partials [NC,H,NK,BL] float32 (or None)."""
    NTOK, H, K = q.shape
    V = do.shape[-1]
    BK = DQKWG_MIN_TILE
    NK = triton.cdiv(K, BK)
    dq = torch.empty_like(q)
    dko = q.new_empty(tab.NC, H, BL, K, dtype=torch.float32)
    dw = k.new_empty(tab.NC, H, BL, K)
    dgp = q.new_empty(tab.NC, H, NK, BL, dtype=torch.float32) if use_g else None
    launch(chunk_dp_bwd_kernel_dqkw, (NK * tab.NC, H),
        q, k, G, h, dh, v_new, dv_new, do, dq, dko, dw, dgp, tab.chunk_bos, tab.chunk_len, scale,
        H=H, K=K, V=V, NH=tab.n, BT=tab.bt_tile(q.dtype), BL=BL, BK=BK, BV=DQKWG_MIN_TILE, USE_G=use_g, PREC=prec)
    return dq, dko, dw, dgp


def chunk_dp_bwd_wy(k, v, beta, G, t, dw, dv_new, dko, dgp, tab: ChunkTable, use_g: bool, prec: str):
    """The WY half. Returns dk, dv, dbeta in their inputs' dtypes and dg [NTOK,H] float32 (or None)."""
    _, H, K = k.shape
    V = v.shape[-1]
    dk, dv, dbeta = torch.empty_like(k), torch.empty_like(v), torch.empty_like(beta)
    dg = dko.new_empty(tab.NTOK, H, dtype=torch.float32) if use_g else None
    scratch = torch.empty_like(t)
    launch(chunk_dp_bwd_kernel_wy, (tab.NC, H),
        k, v, beta, G, t, scratch, dw, dv_new, dko, dgp, dk, dv, dbeta, dg, tab.chunk_bos, tab.chunk_len,
        H=H, K=K, V=V, NH=tab.n, BL=BL, BK=DQKWG_MIN_TILE, BV=DQKWG_MIN_TILE, USE_G=use_g, PREC=prec)
    return dk, dv, dbeta, dg


def chunk_dp_bwd_dqkwg_split(q, k, v, beta, G, t, h, dh, v_new, dv_new, do, tab: ChunkTable, scale: float,
                             use_g: bool, prec: str):
    """chunk_bwd.chunk_dp_bwd_dqkwg's arguments and results (dq, dk, dv, dbeta, dg), by the two kernels above."""
    dq, dko, dw, dgp = chunk_dp_bwd_dqkw(q, k, G, h, dh, v_new, dv_new, do, tab, scale, use_g, prec)
    dk, dv, dbeta, dg = chunk_dp_bwd_wy(k, v, beta, G, t, dw, dv_new, dko, dgp, tab, use_g, prec)
    return dq, dk, dv, dbeta, dg
