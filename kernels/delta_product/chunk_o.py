"""Output of the chunkwise DeltaProduct: one program per (V slice, chunk, head), T query rows only.

o_t = scale * (exp(G_t) q_t h_c + sum_{s <= t*n+n-1} exp(G_t - G_s) (q_t . k_s) v_new_s), G_t = G at t's last step.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..utils import autotune_configs, launch, next_pow2
from .index import BL, ChunkTable


# BV = 128 added after kernel_configs.py on the H200 (session 8): 0.206 against 0.236 ms at n_h = 2 (4 warps)
@triton.autotune(configs=autotune_configs([triton.Config({"BV": bv}, num_warps=w, num_stages=s)
                                           for bv in (64, 128) for w in (4, 8) for s in (2,)], default={"BV": 64}),
                 key=["H", "K", "V", "NH", "BK", "PREC"])
@triton.jit(do_not_specialize=["H"])  # H is a runtime stride: one binary for every head count
def chunk_dp_fwd_kernel_o(
    q, k, G, h, v_new, o, chunk_bos, chunk_len, scale,
    H, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr, BT: tl.constexpr, BL: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
):
    i_v, i_c, i_h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_ch = i_c.to(tl.int64) * H + i_h
    bos = tl.load(chunk_bos + i_c).to(tl.int64)
    n_t = tl.load(chunk_len + i_c)
    o_t = tl.arange(0, BT)
    o_l = tl.arange(0, BL)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_t, m_l, m_k, m_v = o_t < n_t, o_l < n_t * NH, o_k < K, o_v < V

    b_q = tl.load(q + ((bos + o_t[:, None]) * H + i_h) * K + o_k[None, :], mask=m_t[:, None] & m_k[None, :], other=0)
    b_k = tl.load(k + ((bos * NH + o_l[:, None]) * H + i_h) * K + o_k[None, :], mask=m_l[:, None] & m_k[None, :],
                  other=0)
    b_G = tl.load(G + i_ch * BL + o_l)
    b_Gq = tl.load(G + i_ch * BL + o_t * NH + NH - 1, mask=m_t, other=0)
    b_h = tl.load(h + i_ch * K * V + o_k[:, None] * V + o_v[None, :], mask=m_k[:, None] & m_v[None, :], other=0)
    b_vn = tl.load(v_new + i_ch * BL * V + o_l[:, None] * V + o_v[None, :], mask=m_v[None, :], other=0)

    b_o = tl.dot(b_q, b_h.to(b_q.dtype), input_precision=PREC) * tl.exp(b_Gq)[:, None]
    b_s = tl.dot(b_q, tl.trans(b_k), input_precision=PREC)
    m_s = ((o_t * NH + NH - 1)[:, None] >= o_l[None, :]) & m_t[:, None]  # padding tokens: Gq = 0 would overflow
    b_s = tl.where(m_s, b_s * tl.exp(tl.where(m_s, b_Gq[:, None] - b_G[None, :], 0)), 0)
    b_o += tl.dot(b_s.to(b_vn.dtype), b_vn, input_precision=PREC)
    p_o = o + ((bos + o_t[:, None]) * H + i_h) * V + o_v[None, :]
    tl.store(p_o, (b_o * scale).to(o.dtype.element_ty), mask=m_t[:, None] & m_v[None, :])


def chunk_dp_fwd_o(q, k, G, h, v_new, tab: ChunkTable, scale: float, prec: str):
    """q [NTOK,H,K], k [NTOK*n,H,K], G [NC,H,BL], h [NC,H,K,V], v_new [NC,H,BL,V] -> o [NTOK,H,V] (q's dtype)."""
    NTOK, H, K = q.shape
    V = v_new.shape[-1]
    o = q.new_empty(NTOK, H, V)
    grid = lambda meta: (triton.cdiv(V, meta["BV"]), tab.NC, H)
    launch(chunk_dp_fwd_kernel_o, grid, q, k, G, h, v_new, o, tab.chunk_bos, tab.chunk_len, scale, H=H, K=K, V=V,
                                NH=tab.n, BT=tab.bt_tile(q.dtype), BL=BL, BK=next_pow2(K), PREC=prec)
    return o
