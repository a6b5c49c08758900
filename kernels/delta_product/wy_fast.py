"""Per-chunk preparation of the chunkwise DeltaProduct, fused in one kernel (one program per chunk and head).

For the BL = 64 interleaved steps of a chunk, held as four 16-row blocks:
  gate cumsum  G (g_t on each token's first step, 0 on the others)
  A_ij  = beta_i (k_i . k_j) exp(G_i - G_j), i > j            (strictly lower)
  T     = (I + A)^-1: 16x16 diagonal blocks by substitution (bf16: a product form, see _inv16), then the block formula
          T_ij = -T_ii sum_{j <= m < i} A_im T_mj
  W = T (beta exp(G) k),  U = T (beta v),  Kd = exp(G_last - G) k,  gamma = exp(G_last)
Padding rows (past the chunk's end) have k = v = beta = 0 and a zero gate, so they are identity steps.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..utils import autotune_configs, launch, next_pow2
from .index import BL, ChunkTable


@triton.jit
def _load_block(k, beta, g, bos, i_h, n_steps, row0, H: tl.constexpr, K: tl.constexpr, NH: tl.constexpr,
                BK: tl.constexpr, USE_G: tl.constexpr):
    o_r = row0 + tl.arange(0, 16)
    o_k = tl.arange(0, BK)
    m_r = o_r < n_steps
    b_k = tl.load(k + ((bos * NH + o_r[:, None]) * H + i_h) * K + o_k[None, :], mask=m_r[:, None] & (o_k < K)[None, :],
                  other=0)
    b_b = tl.load(beta + (bos * NH + o_r) * H + i_h, mask=m_r, other=0).to(tl.float32)
    if USE_G:
        b_g = tl.load(g + (bos + o_r // NH) * H + i_h, mask=m_r & (o_r % NH == 0), other=0).to(tl.float32)
    else:
        b_g = tl.zeros([16], dtype=tl.float32)
    return b_k, b_b, b_g


@triton.jit
def _A_block(b_ki, b_kj, b_bi, b_Gi, b_Gj, DIAG: tl.constexpr):
    # beta_i (k_i . k_j) exp(G_i - G_j); k stays in its storage dtype (bf16 products are exact in fp32)
    b_A = tl.dot(b_ki, tl.trans(b_kj), input_precision="ieee")
    b_A = b_A * b_bi[:, None] * tl.exp(b_Gi[:, None] - b_Gj[None, :])
    if DIAG:
        o = tl.arange(0, 16)
        b_A = tl.where(o[:, None] > o[None, :], b_A, 0)
    return b_A


@triton.jit
def _mm(a, b):
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _inv16(b_A, FAST: tl.constexpr):
    # (I + A)^-1 for strictly lower 16x16 A.
    o = tl.arange(0, 16)
    b_I = (o[:, None] == o[None, :]).to(tl.float32)
    if FAST:
        # A^16 = 0, so (I+A)^-1 = sum_k (-A)^k = (I - A)(I + A^2)(I + A^4)(I + A^8): six small products instead of
        # 14 dependent steps of two cross-thread reductions each. The alternating series cancels when keys are
        # correlated (float32 error up to ~6e-4 relative, measured on keys of cosine ~0.99), which is below the
        # bf16 rounding T gets anyway; float32/fp16 inputs keep the substitution (~3e-7).
        b_A2 = _mm(b_A, b_A)
        b_A4 = _mm(b_A2, b_A2)
        b_T = _mm(b_I - b_A, b_I + b_A2)
        b_T = _mm(b_T, b_I + b_A4)
        return _mm(b_T, b_I + _mm(b_A4, b_A4))
    else:
        # row by row: Y_i = -A_i - sum_{m<i} A_im Y_m, result I + Y
        b_Y = -b_A
        for i in range(2, 16):
            b_a = -tl.sum(tl.where(o[:, None] == i, b_A, 0), 0)
            b_a = b_a + tl.sum(b_a[:, None] * b_Y, 0)
            b_Y = tl.where(o[:, None] == i, b_a[None, :], b_Y)
        return b_Y + b_I


@triton.jit
def _store_rows(p, x, row0, ld, o_c, m_c):
    tl.store(p + (row0 + tl.arange(0, 16))[:, None] * ld + o_c[None, :], x.to(p.dtype.element_ty), mask=m_c[None, :])


@triton.jit
def _store_block(p, x, row0, col0, BL: tl.constexpr):
    o = tl.arange(0, 16)
    tl.store(p + (row0 + o)[:, None] * BL + col0 + o[None, :], x.to(p.dtype.element_ty))


@triton.heuristics({"STORE_T": lambda a: a["t"] is not None})
@triton.autotune(configs=autotune_configs([triton.Config({}, num_warps=w, num_stages=s) for w in (4, 8)
                                           for s in (1,)]),
                 key=["H", "K", "V", "NH", "BK", "BV", "USE_G", "PREC", "FAST_INV"])
@triton.jit
def chunk_dp_fwd_kernel_prepare(
    k, v, beta, g, w, u, kd, gamma, G, t, chunk_bos, chunk_len,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr, BL: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, USE_G: tl.constexpr, PREC: tl.constexpr, FAST_INV: tl.constexpr, STORE_T: tl.constexpr,
):
    i_c, i_h = tl.program_id(0), tl.program_id(1)
    i_ch = i_c.to(tl.int64) * H + i_h
    bos = tl.load(chunk_bos + i_c).to(tl.int64)
    n_steps = tl.load(chunk_len + i_c) * NH
    b_k1, b_b1, b_g1 = _load_block(k, beta, g, bos, i_h, n_steps, 0, H, K, NH, BK, USE_G)
    b_k2, b_b2, b_g2 = _load_block(k, beta, g, bos, i_h, n_steps, 16, H, K, NH, BK, USE_G)
    b_k3, b_b3, b_g3 = _load_block(k, beta, g, bos, i_h, n_steps, 32, H, K, NH, BK, USE_G)
    b_k4, b_b4, b_g4 = _load_block(k, beta, g, bos, i_h, n_steps, 48, H, K, NH, BK, USE_G)
    # in-chunk cumulative log gate, block by block
    b_G1 = tl.cumsum(b_g1, 0)
    b_G2 = tl.cumsum(b_g2, 0) + tl.sum(b_g1, 0)
    b_G3 = tl.cumsum(b_g3, 0) + tl.sum(b_g1, 0) + tl.sum(b_g2, 0)
    b_G4 = tl.cumsum(b_g4, 0) + tl.sum(b_g1, 0) + tl.sum(b_g2, 0) + tl.sum(b_g3, 0)
    b_Gl = tl.sum(b_g1, 0) + tl.sum(b_g2, 0) + tl.sum(b_g3, 0) + tl.sum(b_g4, 0)

    b_T11 = _inv16(_A_block(b_k1, b_k1, b_b1, b_G1, b_G1, True), FAST_INV)
    b_T22 = _inv16(_A_block(b_k2, b_k2, b_b2, b_G2, b_G2, True), FAST_INV)
    b_T33 = _inv16(_A_block(b_k3, b_k3, b_b3, b_G3, b_G3, True), FAST_INV)
    b_T44 = _inv16(_A_block(b_k4, b_k4, b_b4, b_G4, b_G4, True), FAST_INV)
    b_A21 = _A_block(b_k2, b_k1, b_b2, b_G2, b_G1, False)
    b_A31 = _A_block(b_k3, b_k1, b_b3, b_G3, b_G1, False)
    b_A32 = _A_block(b_k3, b_k2, b_b3, b_G3, b_G2, False)
    b_A41 = _A_block(b_k4, b_k1, b_b4, b_G4, b_G1, False)
    b_A42 = _A_block(b_k4, b_k2, b_b4, b_G4, b_G2, False)
    b_A43 = _A_block(b_k4, b_k3, b_b4, b_G4, b_G3, False)
    b_T21 = -_mm(b_T22, _mm(b_A21, b_T11))
    b_T32 = -_mm(b_T33, _mm(b_A32, b_T22))
    b_T43 = -_mm(b_T44, _mm(b_A43, b_T33))
    b_T31 = -_mm(b_T33, _mm(b_A31, b_T11) + _mm(b_A32, b_T21))
    b_T42 = -_mm(b_T44, _mm(b_A42, b_T22) + _mm(b_A43, b_T32))
    b_T41 = -_mm(b_T44, _mm(b_A41, b_T11) + _mm(b_A42, b_T21) + _mm(b_A43, b_T31))

    if STORE_T:  # the backward needs T = (I+A)^-1; only its lower block triangle is written (and read)
        p_t = t + i_ch * BL * BL
        _store_block(p_t, b_T11, 0, 0, BL)
        _store_block(p_t, b_T21, 16, 0, BL)
        _store_block(p_t, b_T22, 16, 16, BL)
        _store_block(p_t, b_T31, 32, 0, BL)
        _store_block(p_t, b_T32, 32, 16, BL)
        _store_block(p_t, b_T33, 32, 32, BL)
        _store_block(p_t, b_T41, 48, 0, BL)
        _store_block(p_t, b_T42, 48, 16, BL)
        _store_block(p_t, b_T43, 48, 32, BL)
        _store_block(p_t, b_T44, 48, 48, BL)

    dt = w.dtype.element_ty
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    # W = T (beta exp(G) k) in the storage dtype of w (bf16 data: bf16 operands, fp32 accumulation, like fla)
    b_x1 = (b_k1 * (b_b1 * tl.exp(b_G1))[:, None]).to(dt)
    b_x2 = (b_k2 * (b_b2 * tl.exp(b_G2))[:, None]).to(dt)
    b_x3 = (b_k3 * (b_b3 * tl.exp(b_G3))[:, None]).to(dt)
    b_x4 = (b_k4 * (b_b4 * tl.exp(b_G4))[:, None]).to(dt)
    p_w = w + i_ch * BL * K
    _store_rows(p_w, tl.dot(b_T11.to(dt), b_x1, input_precision=PREC), 0, K, o_k, m_k)
    _store_rows(p_w, tl.dot(b_T21.to(dt), b_x1, input_precision=PREC) + tl.dot(b_T22.to(dt), b_x2, input_precision=PREC),
                16, K, o_k, m_k)
    _store_rows(p_w, tl.dot(b_T31.to(dt), b_x1, input_precision=PREC) + tl.dot(b_T32.to(dt), b_x2, input_precision=PREC)
                + tl.dot(b_T33.to(dt), b_x3, input_precision=PREC), 32, K, o_k, m_k)
    _store_rows(p_w, tl.dot(b_T41.to(dt), b_x1, input_precision=PREC) + tl.dot(b_T42.to(dt), b_x2, input_precision=PREC)
                + tl.dot(b_T43.to(dt), b_x3, input_precision=PREC) + tl.dot(b_T44.to(dt), b_x4, input_precision=PREC),
                48, K, o_k, m_k)
    p_kd = kd + i_ch * BL * K
    _store_rows(p_kd, b_k1 * tl.exp(b_Gl - b_G1)[:, None], 0, K, o_k, m_k)
    _store_rows(p_kd, b_k2 * tl.exp(b_Gl - b_G2)[:, None], 16, K, o_k, m_k)
    _store_rows(p_kd, b_k3 * tl.exp(b_Gl - b_G3)[:, None], 32, K, o_k, m_k)
    _store_rows(p_kd, b_k4 * tl.exp(b_Gl - b_G4)[:, None], 48, K, o_k, m_k)
    o_l = tl.arange(0, 16)
    tl.store(G + i_ch * BL + o_l, b_G1)
    tl.store(G + i_ch * BL + 16 + o_l, b_G2)
    tl.store(G + i_ch * BL + 32 + o_l, b_G3)
    tl.store(G + i_ch * BL + 48 + o_l, b_G4)
    tl.store(gamma + i_ch, tl.exp(b_Gl))

    # U = T (beta v), V in slices of BV
    o_r = tl.arange(0, 16)
    p_u = u + i_ch * BL * V
    for i_v in range(0, tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        p_v = v + ((bos * NH + o_r[:, None]) * H + i_h) * V + o_v[None, :]
        b_y1 = (tl.load(p_v, mask=(o_r < n_steps)[:, None] & m_v[None, :], other=0) * b_b1[:, None]).to(dt)
        b_y2 = (tl.load(p_v + 16 * H * V, mask=(16 + o_r < n_steps)[:, None] & m_v[None, :], other=0)
                * b_b2[:, None]).to(dt)
        b_y3 = (tl.load(p_v + 32 * H * V, mask=(32 + o_r < n_steps)[:, None] & m_v[None, :], other=0)
                * b_b3[:, None]).to(dt)
        b_y4 = (tl.load(p_v + 48 * H * V, mask=(48 + o_r < n_steps)[:, None] & m_v[None, :], other=0)
                * b_b4[:, None]).to(dt)
        _store_rows(p_u, tl.dot(b_T11.to(dt), b_y1, input_precision=PREC), 0, V, o_v, m_v)
        _store_rows(p_u, tl.dot(b_T21.to(dt), b_y1, input_precision=PREC)
                    + tl.dot(b_T22.to(dt), b_y2, input_precision=PREC), 16, V, o_v, m_v)
        _store_rows(p_u, tl.dot(b_T31.to(dt), b_y1, input_precision=PREC)
                    + tl.dot(b_T32.to(dt), b_y2, input_precision=PREC)
                    + tl.dot(b_T33.to(dt), b_y3, input_precision=PREC), 32, V, o_v, m_v)
        _store_rows(p_u, tl.dot(b_T41.to(dt), b_y1, input_precision=PREC)
                    + tl.dot(b_T42.to(dt), b_y2, input_precision=PREC)
                    + tl.dot(b_T43.to(dt), b_y3, input_precision=PREC)
                    + tl.dot(b_T44.to(dt), b_y4, input_precision=PREC), 48, V, o_v, m_v)


FAST_INV_DTYPES = (torch.bfloat16,)  # dtypes whose 16x16 inverses use the product form (see _inv16)


def chunk_dp_fwd_prepare(k, v, beta, g, tab: ChunkTable, prec: str, store_t: bool = False):
    """k [NTOK*n,H,K], v [NTOK*n,H,V], beta [NTOK*n,H], g [NTOK,H] float32 or None.
    Returns w, kd [NC,H,BL,K] and u [NC,H,BL,V] in k's dtype, gamma [NC,H] and G [NC,H,BL] float32, and with
    store_t also T = (I+A)^-1 [NC,H,BL,BL] in k's dtype (lower block triangle only; the rest is unwritten)."""
    _, H, K = k.shape
    V = v.shape[-1]
    w = k.new_empty(tab.NC, H, BL, K)
    kd = torch.empty_like(w)
    u = k.new_empty(tab.NC, H, BL, V)
    gamma = k.new_empty(tab.NC, H, dtype=torch.float32)
    G = k.new_empty(tab.NC, H, BL, dtype=torch.float32)
    t = k.new_empty(tab.NC, H, BL, BL) if store_t else None
    launch(chunk_dp_fwd_kernel_prepare, (tab.NC, H),
        k, v, beta, g, w, u, kd, gamma, G, t, tab.chunk_bos, tab.chunk_len, H=H, K=K, V=V, NH=tab.n, BL=BL,
        BK=next_pow2(K), BV=min(64, next_pow2(V)), USE_G=g is not None, PREC=prec,
        FAST_INV=k.dtype in FAST_INV_DTYPES)
    return (w, u, kd, gamma, G, t) if store_t else (w, u, kd, gamma, G)
