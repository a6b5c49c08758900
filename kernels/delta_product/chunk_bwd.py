"""Chunk-parallel backward of the chunkwise DeltaProduct: everything but the serial state recurrence.

Notation per chunk (BL = 64 interleaved steps, BT tokens, i_t = t*n + n-1 the step token t reads out at):
  A = strict_lower(beta_i e^{G_i-G_j} k_i.k_j), T = (I+A)^-1, X = diag(beta e^G) K, Y = diag(beta) V,
  W = T X, U = T Y, Kd = diag(e^{G_L-G}) K, gamma = e^{G_L}, v_new = U - W S, S_next = gamma S + Kd^T v_new,
  o = scale (diag(e^{Gq}) Q S + P v_new),  P_ts = [i_t >= s] e^{Gq_t-G_s} q_t.k_s,  Gq_t = G_{i_t}.
Kernels:
  dv_local  dv_loc = scale P^T dO (the v_new gradient from the chunk's own queries), before the serial walk
  dqkwg     per chunk, after the serial walk (which gives dh = dS_next and dv_new): dq, dk, dv, dbeta, dg,
            with W/U/Kd/gamma/P/T gradients kept in registers (a [64, 64] scratch slot per chunk transposes
            two of them: see the Hopper note in the kernel)
chunk_bwd_split.py computes dqkwg's outputs with two kernels instead (fla's split; DPX_KERNEL_DQKWG=split, opt-in).
Every e^{...} is of a difference G_i - G_j <= 0 (or of G <= 0), so zero and very negative gates are safe.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..utils import autotune_configs, launch, next_pow2
from .index import BL, ChunkTable


# 3 stages added after kernel_configs.py on the H200 (session 8): 1.06-1.09x at n_h 1-3
@triton.autotune(configs=autotune_configs([triton.Config({}, num_warps=w, num_stages=s) for w in (4, 8)
                                           for s in (2, 3)]), key=["H", "K", "V", "NH", "BK", "BV", "PREC"])
@triton.jit(do_not_specialize=["H"])  # H is a runtime stride: one binary for every head count
def chunk_dp_bwd_kernel_dv_local(
    q, k, G, do, dv, chunk_bos, chunk_len, scale,
    H, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr, BT: tl.constexpr, BL: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
):
    i_c, i_h = tl.program_id(0), tl.program_id(1)
    i_ch = i_c.to(tl.int64) * H + i_h
    bos = tl.load(chunk_bos + i_c).to(tl.int64)
    n_t = tl.load(chunk_len + i_c)
    o_t = tl.arange(0, BT)
    o_l = tl.arange(0, BL)
    o_k = tl.arange(0, BK)
    m_t, m_l, m_k = o_t < n_t, o_l < n_t * NH, o_k < K
    b_q = tl.load(q + ((bos + o_t[:, None]) * H + i_h) * K + o_k[None, :], mask=m_t[:, None] & m_k[None, :], other=0)
    b_k = tl.load(k + ((bos * NH + o_l[:, None]) * H + i_h) * K + o_k[None, :], mask=m_l[:, None] & m_k[None, :],
                  other=0)
    b_G = tl.load(G + i_ch * BL + o_l)
    b_Gq = tl.load(G + i_ch * BL + o_t * NH + NH - 1, mask=m_t, other=0)
    # P^T [BL, BT]: step s is seen by token t when s <= i_t
    b_s = tl.dot(b_k, tl.trans(b_q), input_precision=PREC)
    m_s = (o_l[:, None] <= (o_t * NH + NH - 1)[None, :]) & m_t[None, :]  # padding tokens: Gq = 0 would overflow
    b_s = tl.where(m_s, b_s * tl.exp(tl.where(m_s, b_Gq[None, :] - b_G[:, None], 0)), 0) * scale
    b_s = b_s.to(k.dtype.element_ty)
    for i_v in range(0, tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        b_do = tl.load(do + ((bos + o_t[:, None]) * H + i_h) * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :],
                       other=0)
        b_dv = tl.dot(b_s, b_do.to(b_s.dtype), input_precision=PREC)
        tl.store(dv + i_ch * BL * V + o_l[:, None] * V + o_v[None, :], b_dv.to(dv.dtype.element_ty),
                 mask=m_v[None, :])


def _prune_dqkwg(configs, named_args, **kwargs):
    # 8 warps halve the registers per thread (the accumulators spill at 4 warps with BK = 128), but at BK = 32 the
    # H200 run raised an illegal memory access with 8 warps (Triton 3.6); keep them to BK >= 128, where they ran
    return [c for c in configs if c.num_warps == 4 or named_args.get("BK", kwargs.get("BK", 0)) >= 128] or configs[:1]


# 8 warps with 2 stages added after kernel_configs.py on the H200 (session 8): 1.188 against 1.410 ms at n_h = 2,
# 1.16-1.23x at n_h 2-3 gated or not (2 warps were 20x slower: not tried)
@triton.autotune(configs=autotune_configs([triton.Config({}, num_warps=w, num_stages=s) for w, s in
                                           ((4, 1), (8, 1), (8, 2))]),
                 key=["H", "K", "V", "NH", "BK", "BV", "USE_G", "PREC"],
                 prune_configs_by={"early_config_prune": _prune_dqkwg})
@triton.jit(do_not_specialize=["H"])  # H is a runtime stride: one binary for every head count
def chunk_dp_bwd_kernel_dqkwg(
    q, k, v, beta, G, t, s, h, dh, v_new, dv_new, do, dq, dk, dv, dbeta, dg, chunk_bos, chunk_len, scale,
    H, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr, BT: tl.constexpr, BL: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, USE_G: tl.constexpr, PREC: tl.constexpr,
):
    i_c, i_h = tl.program_id(0), tl.program_id(1)
    i_ch = i_c.to(tl.int64) * H + i_h
    bos = tl.load(chunk_bos + i_c).to(tl.int64)
    n_t = tl.load(chunk_len + i_c)
    n_steps = n_t * NH
    o_t = tl.arange(0, BT)
    o_l = tl.arange(0, BL)
    o_k = tl.arange(0, BK)
    m_t, m_l, m_k = o_t < n_t, o_l < n_steps, o_k < K
    dt = k.dtype.element_ty
    p_q = ((bos + o_t[:, None]) * H + i_h) * K + o_k[None, :]
    p_k = ((bos * NH + o_l[:, None]) * H + i_h) * K + o_k[None, :]
    b_q = tl.load(q + p_q, mask=m_t[:, None] & m_k[None, :], other=0)
    b_k = tl.load(k + p_k, mask=m_l[:, None] & m_k[None, :], other=0)
    b_b = tl.load(beta + (bos * NH + o_l) * H + i_h, mask=m_l, other=0).to(tl.float32)
    b_G = tl.load(G + i_ch * BL + o_l)
    b_Gq = tl.load(G + i_ch * BL + o_t * NH + NH - 1, mask=m_t, other=0)
    # T^T, loaded transposed (the backward only ever multiplies by T^T); its upper triangle was never written
    b_Tt = tl.load(t + i_ch * BL * BL + o_l[None, :] * BL + o_l[:, None], mask=o_l[None, :] >= o_l[:, None], other=0)

    # sums over V, one BV slice at a time (five [*, BK]/[*, BL] float32 accumulators: what limits occupancy)
    b_dqS = tl.zeros([BT, BK], dtype=tl.float32)   # dO S^T
    b_dP = tl.zeros([BT, BL], dtype=tl.float32)    # dO v_new^T
    b_dk = tl.zeros([BL, BK], dtype=tl.float32)    # first dKd = v_new dS_next^T, then dk
    b_dW = tl.zeros([BL, BK], dtype=tl.float32)    # -dv_new S^T
    b_dT = tl.zeros([BL, BL], dtype=tl.float32)    # dU Y^T (+ dW X^T below)
    b_db = tl.zeros([BL], dtype=tl.float32)
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
        b_do = tl.load(do + ((bos + o_t[:, None]) * H + i_h) * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :],
                       other=0).to(dt)
        b_v = tl.load(v + ((bos * NH + o_l[:, None]) * H + i_h) * V + o_v[None, :], mask=m_l[:, None] & m_v[None, :],
                      other=0)
        b_dqS += tl.dot(b_do, tl.trans(b_h), input_precision=PREC)
        b_dP += tl.dot(b_do, tl.trans(b_vn), input_precision=PREC)
        b_dk += tl.dot(b_vn, tl.trans(b_dh), input_precision=PREC)
        b_dW -= tl.dot(b_dvn, tl.trans(b_h), input_precision=PREC)
        b_dgam += tl.sum(b_h.to(tl.float32) * b_dh.to(tl.float32), 1)
        # U = T Y, Y = diag(beta) V:  dY = T^T dU, dv = beta dY, dbeta += dY . v, dT += dU Y^T
        b_dY = tl.dot(b_Tt, b_dvn, input_precision=PREC)
        tl.store(dv + ((bos * NH + o_l[:, None]) * H + i_h) * V + o_v[None, :], (b_dY * b_b[:, None]).to(
            dv.dtype.element_ty), mask=m_l[:, None] & m_v[None, :])
        b_db += tl.sum(b_dY * b_v.to(tl.float32), 1)
        b_dT += tl.dot(b_dvn, tl.trans((b_v * b_b[:, None]).to(dt)), input_precision=PREC)

    # The gate gradient's terms are reduced to vectors as soon as their [64, *] operands are formed, so those tiles
    # die early (b_dqS and b_KK were live to the kernel's end before: more registers spilt in the gated build).
    # R = D * QK^T stays at the end: formed where D is, it raised the float32 d = 128 build's shared memory over
    # the limit (262 KB against 196 KB: no config fit)
    b_dGq0 = tl.zeros([BT], dtype=tl.float32)   # scale e^Gq q . dO S^T   (the e^Gq factor)
    b_Ms0 = tl.zeros([BL], dtype=tl.float32)    # sum_i M[i, s], M = dA * A  (A's decay)
    b_Ms1 = tl.zeros([BL], dtype=tl.float32)    # sum_j M[s, j]
    b_dgs = tl.sum(b_dgam, 0)
    # state update: Kd = e^{G_L-G} K, gamma = e^{G_L}; b_dk holds dKd so far
    b_GL = tl.sum(tl.where(o_l == BL - 1, b_G, 0), 0)
    b_ed = tl.exp(b_GL - b_G)
    b_kdk = tl.sum(b_dk * b_k.to(tl.float32), 1) * b_ed   # dKd_s . Kd_s, for the gate gradient
    b_dk = b_dk * b_ed[:, None]
    # output: o = scale (e^Gq Q S + P v_new); b_D = dP * mask * decay, so dq += D K, dk += D^T Q
    m_s = ((o_t * NH + NH - 1)[:, None] >= o_l[None, :]) & m_t[:, None]
    b_D = tl.where(m_s, b_dP * tl.exp(tl.where(m_s, b_Gq[:, None] - b_G[None, :], 0)), 0) * scale
    b_eGq = tl.exp(b_Gq)
    if USE_G:
        b_dGq0 = scale * b_eGq * tl.sum(b_q.to(tl.float32) * b_dqS, 1)
    b_Dc = b_D.to(dt)
    b_dq = b_dqS * (scale * b_eGq)[:, None] + tl.dot(b_Dc, b_k, input_precision=PREC)
    tl.store(dq + p_q, b_dq.to(dq.dtype.element_ty), mask=m_t[:, None] & m_k[None, :])
    # D^T Q. Triton >= 3.4 on Hopper miscompiles tl.trans of a dot result fed to another dot (wrong values, seen
    # here as a wrong dk on the H200; fla PR #826), so D goes through memory and comes back transposed: a [64, 64]
    # scratch slot per (chunk, head) (not T's: T is the forward's, saved for every backward call); the barriers
    # order the program's own reads and writes.
    p_s = s + i_ch * BL * BL
    tl.debug_barrier()
    tl.store(p_s + o_t[:, None] * BL + o_l[None, :], b_Dc)
    tl.debug_barrier()
    b_dk += tl.dot(tl.load(p_s + o_l[:, None] + o_t[None, :] * BL), b_q, input_precision=PREC)
    # W = T X, X = diag(beta e^G) K:  dT += dW X^T, dX = T^T dW
    b_eG = tl.exp(b_G)
    b_dWc = b_dW.to(dt)
    b_dT += tl.dot(b_dWc, tl.trans((b_k * (b_b * b_eG)[:, None]).to(dt)), input_precision=PREC)
    b_dX = tl.dot(b_Tt, b_dWc, input_precision=PREC)
    b_xk = tl.sum(b_dX * b_k.to(tl.float32), 1)
    b_dk += b_dX * (b_b * b_eG)[:, None]
    # T = (I+A)^-1: dA = -T^T dT T^T on the strict lower triangle
    m_a = o_l[:, None] > o_l[None, :]
    b_dA = tl.dot(tl.dot(b_Tt, b_dT.to(dt), input_precision=PREC).to(dt), b_Tt, input_precision=PREC)
    b_E = tl.where(m_a, tl.exp(tl.where(m_a, b_G[:, None] - b_G[None, :], 0)), 0)
    b_dA = tl.where(m_a, -b_dA, 0)
    b_KK = tl.dot(b_k, tl.trans(b_k), input_precision=PREC) * b_E   # A = diag(beta) KK
    b_db += b_xk * b_eG + tl.sum(b_dA * b_KK, 1)
    if USE_G:
        b_M = b_dA * b_KK * b_b[:, None]
        b_Ms1 = tl.sum(b_M, 1)
        b_Ms0 = tl.sum(b_M, 0)
    # A_ij = beta_i e^{G_i-G_j} k_i.k_j: dk_i += sum_j Bm_ij k_j and dk_j += sum_i Bm_ij k_i, one product with
    # Bm + Bm^T (strictly lower + strictly upper: the sum rounds nothing); Bm^T through memory as D^T above
    b_Bm = (b_dA * b_E * b_b[:, None]).to(dt)
    tl.debug_barrier()
    tl.store(p_s + o_l[:, None] * BL + o_l[None, :], b_Bm)
    tl.debug_barrier()
    b_Bm += tl.load(p_s + o_l[:, None] + o_l[None, :] * BL)
    b_dk += tl.dot(b_Bm, b_k, input_precision=PREC)
    tl.store(dk + p_k, b_dk.to(dk.dtype.element_ty), mask=m_l[:, None] & m_k[None, :])
    tl.store(dbeta + (bos * NH + o_l) * H + i_h, b_db.to(dbeta.dtype.element_ty), mask=m_l)

    if USE_G:
        # dG_s from every exp: A (M = dA * A), X, Kd and gamma (at G_L), P (R = D * QK^T), e^Gq (at i_t); the
        # row and column sums of M were taken above, where M's operands were formed
        b_dG = b_Ms1 - b_Ms0 + b_b * b_eG * b_xk
        b_R = b_D * tl.dot(b_q, tl.trans(b_k), input_precision=PREC)   # R = D * QK^T (P's decay)
        b_dG -= tl.sum(b_R, 0)
        b_dG -= b_kdk
        b_dG += tl.where(o_l == BL - 1, tl.sum(b_kdk, 0) + b_dgs * tl.exp(b_GL), 0)
        b_dGq = b_dGq0 + tl.sum(b_R, 1)
        b_dG += tl.sum(tl.where((o_t * NH + NH - 1)[:, None] == o_l[None, :], b_dGq[:, None], 0), 0)
        # G = in-chunk cumsum of the per-step log gate (g_t on step t*n): dg_t = sum_{s >= t*n} dG_s
        b_dgi = tl.cumsum(b_dG, 0, reverse=True)
        tl.store(dg + (bos + o_l // NH) * H + i_h, b_dgi, mask=m_l & (o_l % NH == 0))


def chunk_dp_bwd_dv_local(q, k, G, do, tab: ChunkTable, scale: float, prec: str):
    """q [NTOK,H,K], k [NTOK*n,H,K], G [NC,H,BL], do [NTOK,H,V] -> dv_loc [NC,H,BL,V] in k's dtype."""
    NTOK, H, K = q.shape
    V = do.shape[-1]
    dv = k.new_empty(tab.NC, H, BL, V)
    launch(chunk_dp_bwd_kernel_dv_local, (tab.NC, H),
        q, k, G, do, dv, tab.chunk_bos, tab.chunk_len, scale, H=H, K=K, V=V, NH=tab.n, BT=tab.bt_tile(q.dtype), BL=BL,
        BK=next_pow2(K), BV=min(64, next_pow2(V)), PREC=prec)
    return dv


# The per-chunk gradient kernel's K and V tiles are at least 64 wide (masked past K, V). At head dim 32 its bf16
# build raised an illegal memory access on the H200 in every config (Triton 3.6; issue 14: B=512, T=32, H=4 and
# B=8, T=128, H=4), while float32 passed: the pattern of Triton's Hopper wgmma faults in multi-dot kernels with
# 32-wide blocks (triton-lang/triton#10486, #11366). 64-wide tiles cost the d = 32 models (state tracking, where
# this kernel is a small part of the step) up to twice this kernel's work and avoid that code path.
DQKWG_MIN_TILE = 64


def chunk_dp_bwd_dqkwg(q, k, v, beta, G, t, h, dh, v_new, dv_new, do, tab: ChunkTable, scale: float, use_g: bool,
                       prec: str):
    """Per-chunk gradients. Returns dq, dk, dv, dbeta in their inputs' dtypes and dg [NTOK,H] float32 (or None)."""
    NTOK, H, K = q.shape
    V = v.shape[-1]
    dq, dk, dv, dbeta = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(beta)
    dg = q.new_empty(NTOK, H, dtype=torch.float32) if use_g else None
    scratch = torch.empty_like(t)
    launch(chunk_dp_bwd_kernel_dqkwg, (tab.NC, H),
        q, k, v, beta, G, t, scratch, h, dh, v_new, dv_new, do, dq, dk, dv, dbeta, dg, tab.chunk_bos, tab.chunk_len, scale,
        H=H, K=K, V=V, NH=tab.n, BT=tab.bt_tile(q.dtype), BL=BL, BK=next_pow2(K, DQKWG_MIN_TILE), BV=DQKWG_MIN_TILE,
        USE_G=use_g, PREC=prec)
    return dq, dk, dv, dbeta, dg
