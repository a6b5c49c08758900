"""Per-chunk preparation of the chunkwise DeltaProduct: two kernels, one program per chunk and head each.

chunk_dp_fwd_kernel_inv, for the BL = 64 interleaved steps of a chunk held as four 16-row blocks:
  gate cumsum  G (g_t on each token's first step, 0 on the others), gamma = exp(G_last)
  A_ij  = beta_i (k_i . k_j) exp(G_i - G_j), i > j            (strictly lower)
  T     = (I + A)^-1: 16x16 diagonal blocks by substitution (bf16: a product form, see _inv16), then the block formula
          T_ij = -T_ii sum_{j <= m < i} A_im T_mj; written (lower block triangle) to t [NC, H, 64, 64]
chunk_dp_fwd_kernel_wu, from T as one [64, 64] tile (fla's recompute_w_u: 64-row products, not 16-row ones):
  W = T (beta exp(G) k),  U = T (beta v)
  (Kd = exp(G_last - G) k, the decayed keys the state walks need, is formed in the walks from k and G: chunk_h)
The forward runs both and keeps T and G for the backward, which re-runs only the second (a few 64-row products)
instead of the whole preparation.
Padding rows (past the chunk's end) have k = v = beta = 0 and a zero gate, so they are identity steps.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..utils import autotune_configs, launch, next_pow2
from .index import BL, ChunkTable


@triton.jit
def _load_block(k, beta, g, bos, i_h, n_steps, row0, H, K: tl.constexpr, NH: tl.constexpr,
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
def _store_block(p, x, row0, col0, BL: tl.constexpr):
    o = tl.arange(0, 16)
    tl.store(p + (row0 + o)[:, None] * BL + col0 + o[None, :], x.to(p.dtype.element_ty))


def _inv_prune(configs, named_args, **kwargs):
    """bfloat16 (FAST_INV) at head dims up to 128: 2 warps only. Session 8's sweep on the H200 (bf16, d = 128) had 2
    warps fastest at every n_h 1-3, gated or not, by 1.30-1.37x over 4 (n_h 3: 0.440 against 0.577 ms), and yet the
    autotuner picked 4 there in one of two runs at one sha (session 13: inv 0.579 against 0.438 ms, the whole forward
    difference). Wider tiles, float32 and float16 (other inverse, no sweep) keep every config."""
    if kwargs.get("FAST_INV") and kwargs.get("BK", 256) <= 128:
        return [c for c in configs if c.num_warps == 2] or configs
    return configs


# 2 warps added after kernel_configs.py on the H200 (session 8): 0.291 against 0.381 ms at n_h = 2 (1.3x at n_h 1-3,
# gated or not); 8 warps were 1.8x slower there but stay for the wide head dims
@triton.autotune(configs=autotune_configs([triton.Config({}, num_warps=w, num_stages=s) for w in (2, 4, 8)
                                           for s in (1,)]),
                 key=["K", "NH", "BK", "USE_G", "FAST_INV"], prune_configs_by={"early_config_prune": _inv_prune})
@triton.jit(do_not_specialize=["H"])  # H is a runtime stride: one binary for every head count
def chunk_dp_fwd_kernel_inv(
    k, beta, g, gamma, G, t, chunk_bos, chunk_len,
    H, K: tl.constexpr, NH: tl.constexpr, BL: tl.constexpr, BK: tl.constexpr, USE_G: tl.constexpr,
    FAST_INV: tl.constexpr,
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

    # T's lower block triangle (the blocks above the diagonal are never written, nor read unmasked)
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
    o_l = tl.arange(0, 16)
    tl.store(G + i_ch * BL + o_l, b_G1)
    tl.store(G + i_ch * BL + 16 + o_l, b_G2)
    tl.store(G + i_ch * BL + 32 + o_l, b_G3)
    tl.store(G + i_ch * BL + 48 + o_l, b_G4)
    tl.store(gamma + i_ch, tl.exp(b_Gl))


# BV = 128 added after kernel_configs.py on the H200 (session 8): 0.229 against 0.268 ms at n_h = 2 (8 warps)
@triton.autotune(configs=autotune_configs([triton.Config({"BV": bv}, num_warps=w, num_stages=s)
                                           for bv in (32, 64, 128) for w in (4, 8) for s in (2,)],
                                          default={"BV": 64}),
                 key=["K", "V", "NH", "BK", "PREC"])
@triton.jit(do_not_specialize=["H"])
def chunk_dp_fwd_kernel_wu(
    k, v, beta, G, t, w, u, chunk_bos, chunk_len,
    H, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr, BL: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    PREC: tl.constexpr,
):
    # W = T X, U = T Y with T one [64, 64] tile: 64-row products (wgmma-sized on Hopper), not 16-row ones
    i_c, i_h = tl.program_id(0), tl.program_id(1)
    i_ch = i_c.to(tl.int64) * H + i_h
    bos = tl.load(chunk_bos + i_c).to(tl.int64)
    n_steps = tl.load(chunk_len + i_c) * NH
    o_l = tl.arange(0, BL)
    o_k = tl.arange(0, BK)
    m_l, m_k = o_l < n_steps, o_k < K
    dt = w.dtype.element_ty
    b_T = tl.load(t + i_ch * BL * BL + o_l[:, None] * BL + o_l[None, :], mask=o_l[:, None] >= o_l[None, :],
                  other=0).to(dt)
    b_G = tl.load(G + i_ch * BL + o_l)
    b_b = tl.load(beta + (bos * NH + o_l) * H + i_h, mask=m_l, other=0).to(tl.float32)
    b_k = tl.load(k + ((bos * NH + o_l[:, None]) * H + i_h) * K + o_k[None, :], mask=m_l[:, None] & m_k[None, :],
                  other=0)
    p_lk = i_ch * BL * K + o_l[:, None] * K + o_k[None, :]
    b_x = (b_k * (b_b * tl.exp(b_G))[:, None]).to(dt)
    tl.store(w + p_lk, tl.dot(b_T, b_x, input_precision=PREC).to(dt), mask=m_k[None, :])
    for i_v in range(0, tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        b_v = tl.load(v + ((bos * NH + o_l[:, None]) * H + i_h) * V + o_v[None, :], mask=m_l[:, None] & m_v[None, :],
                      other=0)
        b_y = (b_v * b_b[:, None]).to(dt)
        tl.store(u + i_ch * BL * V + o_l[:, None] * V + o_v[None, :], tl.dot(b_T, b_y, input_precision=PREC).to(dt),
                 mask=m_v[None, :])


FAST_INV_DTYPES = (torch.bfloat16,)  # dtypes whose 16x16 inverses use the product form (see _inv16)


def chunk_dp_fwd_inv(k, beta, g, tab: ChunkTable):
    """k [NTOK*n,H,K], beta [NTOK*n,H], g [NTOK,H] float32 or None.
    Returns T = (I+A)^-1 [NC,H,BL,BL] in k's dtype (lower block triangle written; the rest is never read),
    G [NC,H,BL] and gamma [NC,H] float32."""
    _, H, K = k.shape
    gamma = k.new_empty(tab.NC, H, dtype=torch.float32)
    G = k.new_empty(tab.NC, H, BL, dtype=torch.float32)
    t = k.new_empty(tab.NC, H, BL, BL)
    launch(chunk_dp_fwd_kernel_inv, (tab.NC, H),
        k, beta, g, gamma, G, t, tab.chunk_bos, tab.chunk_len, H=H, K=K, NH=tab.n, BL=BL, BK=next_pow2(K),
        USE_G=g is not None, FAST_INV=k.dtype in FAST_INV_DTYPES)
    return t, G, gamma


def chunk_dp_fwd_wu(k, v, beta, G, t, tab: ChunkTable, prec: str):
    """W [NC,H,BL,K] and U [NC,H,BL,V] in k's dtype, from T and G of chunk_dp_fwd_inv."""
    _, H, K = k.shape
    V = v.shape[-1]
    w = k.new_empty(tab.NC, H, BL, K)
    u = k.new_empty(tab.NC, H, BL, V)
    launch(chunk_dp_fwd_kernel_wu, (tab.NC, H),
        k, v, beta, G, t, w, u, tab.chunk_bos, tab.chunk_len, H=H, K=K, V=V, NH=tab.n, BL=BL, BK=next_pow2(K),
        PREC=prec)
    return w, u


def chunk_dp_fwd_prepare(k, v, beta, g, tab: ChunkTable, prec: str, store_t: bool = False):
    """Both kernels. Returns w, u, gamma, G (and T with store_t), as chunk_dp_fwd_inv / chunk_dp_fwd_wu."""
    t, G, gamma = chunk_dp_fwd_inv(k, beta, g, tab)
    w, u = chunk_dp_fwd_wu(k, v, beta, G, t, tab, prec)
    return (w, u, gamma, G, t) if store_t else (w, u, gamma, G)
