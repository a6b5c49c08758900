"""Output of the chunkwise DeltaProduct: one program per (V slice, chunk, head), T query rows only.

o_t = scale * (exp(G_t) q_t h_c + sum_{s <= t*n+n-1} exp(G_t - G_s) (q_t . k_s) v_new_s), G_t = G at t's last step.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..utils import autotune_configs, launch, next_pow2
from .index import BL, ChunkTable, query_tile


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


# -- the output over super-chunks, fla's layout (DPX_KERNEL_FWD=tok, the default at n_h > 1) ---------------------------
# Per super-chunk s (n consecutive chunks of one sequence, <= 64 tokens), V slice and head:
#     o_t = scale * (exp(Gq_t) q_t h_s + sum_{i < n} sum_{tokens u <= t} exp(Gq_t - Gq_u) (q_t . k_{u,i}) v_new_{u,i})
# k_{u,i} = k[bos_u * n + i] (the interleaved keys as stored), v_new_{u,i} = row (u % BT) * n + i of u's chunk (the
# walk's corrected values, per chunk), Gq = the token-level log gate cumsum from the super-chunk's start. A gate enters
# at a token's first step, so every step of token u carries the log gate Gq_u: one [64, 64] token-level decay matrix
# serves all n steps (fla's chunk_gated_delta_product_fwd_o). The sum is exact: the state after the super-chunk's step
# r is h_s decayed plus k_r v_new_r^T over its steps r' <= r, whichever chunk-start state each v_new_r was computed
# against. Against chunk_dp_fwd_kernel_o (one state per 64-step chunk, BT query rows) it reads n x fewer state bytes
# and fills 64-row tiles: on the H200 (B=4 T=4096 H=16 d=128 bf16, session 16, benchmarks/out_proto.py) 0.168 against
# 0.206 ms at n_h 2 and 0.218 against 0.300 at n_h 3 (fla's fwd_o: 0.170 / 0.202).
# H_PER_CHUNK: h holds a state per chunk (the walk that keeps them for the backward; the super-chunk's state is its
# first chunk's) or one per super-chunk (chunk_super's walk, when no backward needs them).
@triton.heuristics({"USE_G": lambda a: a["G"] is not None})
@triton.autotune(configs=autotune_configs([triton.Config({"BV": bv}, num_warps=w, num_stages=s)
                                           for bv in (64, 128) for w in (4, 8) for s in (2, 3)], default={"BV": 64}),
                 key=["H", "K", "V", "NH", "KT", "PREC", "USE_G", "H_PER_CHUNK"])
@triton.jit(do_not_specialize=["H"])
def chunk_dp_fwd_kernel_o_tok(
    q, k, G, h, v_new, o, chunk_bos, sc_chunk0, sc_len, scale,
    H, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr, BT: tl.constexpr, BTQ: tl.constexpr, BL: tl.constexpr,
    KT: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr, USE_G: tl.constexpr, H_PER_CHUNK: tl.constexpr,
):
    # BT: tokens of a full chunk; BTQ: query (and key-token) rows, a power of two >= NH * BT; NH chunks a super-chunk
    # (and steps a token); KT: the K tile (64, or the next power of two >= 16 below that)
    i_v, i_s, i_h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    c0 = tl.load(sc_chunk0 + i_s).to(tl.int64)
    n_tok = tl.load(sc_len + i_s)
    bos = tl.load(chunk_bos + c0).to(tl.int64)  # the super-chunk's chunks hold consecutive tokens from here
    o_t = tl.arange(0, BTQ)
    o_v = i_v * BV + tl.arange(0, BV)
    m_t, m_v = o_t < n_tok, o_v < V
    j_t = o_t // BT  # each token's chunk within the super-chunk
    r_t = o_t % BT   # and its row of tokens there
    i_hs = c0 if H_PER_CHUNK else i_s.to(tl.int64)

    # q h over K in KT-wide tiles (a loop: the registers of one tile pair at a time, as fla)
    b_o = tl.zeros([BTQ, BV], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, KT)):
        o_k = i_k * KT + tl.arange(0, KT)
        m_k = o_k < K
        b_q = tl.load(q + ((bos + o_t[:, None]) * H + i_h) * K + o_k[None, :], mask=m_t[:, None] & m_k[None, :],
                      other=0)
        b_h = tl.load(h + (i_hs * H + i_h) * K * V + o_k[:, None] * V + o_v[None, :],
                      mask=m_k[:, None] & m_v[None, :], other=0)
        b_o = tl.dot(b_q, b_h.to(b_q.dtype), b_o, input_precision=PREC)
    m_A = (o_t[:, None] >= o_t[None, :]) & m_t[:, None] & m_t[None, :]  # token u <= t, both real
    if USE_G:
        # the token-level log gate from the super-chunk's start: the chunk's own cumsum at the token's last step,
        # plus the totals (row BL - 1) of the chunks before it
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


def chunk_dp_fwd_o_tok(q, k, G, h, v_new, tab: ChunkTable, scale: float, prec: str, gated: bool, per_chunk: bool):
    """q [NTOK,H,K], k [NTOK*n,H,K], G [NC,H,BL], h [NC,H,K,V] (per_chunk: chunk_h's walk) or [NSC,H,K,V] (one per
    super-chunk: chunk_super's walk), v_new [NC,H,BL,V] -> o [NTOK,H,V] (q's dtype). gated: whether G holds gates
    (False: all zero, not read)."""
    NTOK, H, K = q.shape
    V = v_new.shape[-1]
    o = q.new_empty(NTOK, H, V)
    launch(chunk_dp_fwd_kernel_o_tok, lambda meta: (triton.cdiv(V, meta["BV"]), tab.NSC, H),
           q, k, G if gated else None, h, v_new, o, tab.chunk_bos, tab.sc_chunk0, tab.sc_len, scale, H=H, K=K, V=V,
           NH=tab.n, BT=tab.BT, BTQ=query_tile(tab.n * tab.BT, q.dtype), BL=BL, KT=min(64, max(16, next_pow2(K))),
           PREC=prec, H_PER_CHUNK=per_chunk)
    return o
