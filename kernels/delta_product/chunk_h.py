"""The serial part of the chunkwise algorithm: the state recurrence across chunks, forward and backward.

Per sequence and head, over its chunks c (S = state at the chunk start, stored as h[c]):
    v_new_c = U_c - W_c S
    S       = gamma_c S + Kd_c^T v_new_c
One program owns a [K, BV] slice of the state of one (sequence, head) and walks its chunks (the backward walks
them in reverse, carrying the gradient of the state; see chunk_dp_bwd_kernel_dh).
Kd_c = exp(G_L - G) k (the decayed keys of the chunk's steps) is formed here from k and the gate cumsum G, not read
from a tensor: `_kd_tile` (wy_fast's wu kernel used to store it, 0.20 GB at n_h 3, B=4 T=4096 H=16 d=128 bf16, for
the walks to read back); without gates it is k itself.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..utils import autotune_configs, launch, next_pow2
from .index import BL, ChunkTable


@triton.jit
def _seq_tokens(chunk_bos, chunk_len, c_bos, c_eos):
    # a sequence's first token and its end, loaded once: its chunks are consecutive runs of BT tokens from tok0
    # (index._build), so a walk finds chunk c's first token as tok0 + (c - c_bos) * BT with no load in its loop,
    # which keeps every address of the loop affine in the loop index: what Triton's pipeliner needs to issue the
    # next chunk's loads (cp.async) while this chunk's dots run
    has = c_eos > c_bos
    c_last = tl.maximum(c_eos - 1, c_bos)
    tok0 = tl.load(chunk_bos + c_bos, mask=has, other=0).to(tl.int64)
    tok_end = tl.load(chunk_bos + c_last, mask=has, other=0).to(tl.int64) + \
        tl.load(chunk_len + c_last, mask=has, other=0).to(tl.int64)
    return tok0, tok_end


@triton.jit
def _kd_tile(k, G, bos, n_tok, i_ch, i_h, H, o_l, o_k, m_k, K: tl.constexpr, NH: tl.constexpr, BL: tl.constexpr,
             USE_G: tl.constexpr):
    # Kd of the chunk whose first token is bos (n_tok tokens), [BL, BK]: its steps' keys (interleaved rows of k; rows
    # past its steps, padding, are zero) times exp(G_L - G) with gates, the very expression (same operands, one
    # rounding) wy_fast's wu kernel stored as kd
    m_l = o_l < n_tok * NH
    b_k = tl.load(k + ((bos * NH + o_l[:, None]) * H + i_h) * K + o_k[None, :], mask=m_l[:, None] & m_k[None, :],
                  other=0)
    if USE_G:
        b_G = tl.load(G + i_ch * BL + o_l)
        b_k = (b_k * tl.exp(tl.load(G + i_ch * BL + BL - 1) - b_G)[:, None]).to(b_k.dtype)
    return b_k


def _configs():
    # 3 stages added after benchmarks/kernel_configs.py on the H200 (session 8): fwd_h's best there is BV=64, 4 warps,
    # 3 stages (0.269 against 0.293 ms at n_h = 2, B=4 T=4096 H=16 d=128 bf16); dh's 3 stages win at n_h = 1 (1.06x)
    return autotune_configs([triton.Config({"BV": bv}, num_warps=w, num_stages=s)
                             for bv in (32, 64) for w in (4, 8) for s in (2, 3)], default={"BV": 32})


@triton.heuristics({"USE_INITIAL_STATE": lambda a: a["h0"] is not None,
                    "STORE_FINAL_STATE": lambda a: a["ht"] is not None})
@triton.autotune(configs=_configs(), key=["H", "K", "V", "NH", "BK", "PREC", "USE_G"])
@triton.jit(do_not_specialize=["H"])  # H is a runtime stride: one binary for every head count
def chunk_dp_fwd_kernel_h(
    w, u, k, G, gamma, h0, h, v_new, ht, chunk_bos, chunk_len, seq_chunks,
    H, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr, BTC: tl.constexpr, BL: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, PREC: tl.constexpr, USE_G: tl.constexpr, USE_INITIAL_STATE: tl.constexpr,
    STORE_FINAL_STATE: tl.constexpr,
):
    # BTC: tokens of a full chunk (64 // NH)
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // H, i_nh % H
    c_bos = tl.load(seq_chunks + i_n).to(tl.int64)
    c_eos = tl.load(seq_chunks + i_n + 1).to(tl.int64)
    tok0, tok_end = _seq_tokens(chunk_bos, chunk_len, c_bos, c_eos)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    o_l = tl.arange(0, BL)
    m_k, m_v = o_k < K, o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    o_kv = o_k[:, None] * V + o_v[None, :]

    b_h = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_INITIAL_STATE:
        b_h += tl.load(h0 + i_nh.to(tl.int64) * K * V + o_kv, mask=m_kv, other=0).to(tl.float32)
    for i_c in range(c_bos, c_eos):
        i_ch = i_c * H + i_h
        tl.store(h + i_ch * K * V + o_kv, b_h.to(h.dtype.element_ty), mask=m_kv)
        p_lk = i_ch * BL * K + o_l[:, None] * K + o_k[None, :]
        p_lv = i_ch * BL * V + o_l[:, None] * V + o_v[None, :]
        b_w = tl.load(w + p_lk, mask=m_k[None, :], other=0)
        b_u = tl.load(u + p_lv, mask=m_v[None, :], other=0).to(tl.float32)
        b_v = b_u - tl.dot(b_w, b_h.to(b_w.dtype), input_precision=PREC)
        tl.store(v_new + p_lv, b_v.to(v_new.dtype.element_ty), mask=m_v[None, :])
        bos = tok0 + (i_c - c_bos) * BTC
        b_kd = _kd_tile(k, G, bos, tl.minimum(tok_end - bos, BTC), i_ch, i_h, H, o_l, o_k, m_k, K, NH, BL, USE_G)
        b_g = tl.load(gamma + i_ch).to(tl.float32)
        b_h = b_h * b_g + tl.dot(tl.trans(b_kd), b_v.to(b_kd.dtype), input_precision=PREC)
    if STORE_FINAL_STATE:
        tl.store(ht + i_nh.to(tl.int64) * K * V + o_kv, b_h.to(ht.dtype.element_ty), mask=m_kv)


@triton.heuristics({"USE_FINAL_STATE_GRAD": lambda a: a["dht"] is not None,
                    "STORE_INITIAL_STATE_GRAD": lambda a: a["dh0"] is not None})
@triton.autotune(configs=_configs(), key=["H", "K", "V", "NH", "BK", "PREC", "USE_G"])
@triton.jit(do_not_specialize=["H"])  # H is a runtime stride: one binary for every head count
def chunk_dp_bwd_kernel_dh(
    q, do, w, k, gamma, G, dv_loc, dht, dh, dv_new, dh0, chunk_bos, chunk_len, seq_chunks, scale,
    H, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr, BT: tl.constexpr, BTC: tl.constexpr, BL: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr, USE_G: tl.constexpr, USE_FINAL_STATE_GRAD: tl.constexpr,
    STORE_INITIAL_STATE_GRAD: tl.constexpr,
):
    # BT: the query tile's rows (index.query_tile); BTC: tokens of a full chunk (64 // NH)
    # Reverse walk carrying dS = gradient w.r.t. the state after the current chunk (dht at the sequence end):
    #   dv_new_c = dv_loc_c + Kd_c dS                     (S_next = gamma S + Kd^T v_new)
    #   dS      <- gamma_c dS + scale (e^Gq Q_c)^T dO_c - W_c^T dv_new_c   (o reads S; v_new = U - W S)
    # dS before each chunk's update is stored as dh[c], for the per-chunk gradient kernel.
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // H, i_nh % H
    c_bos = tl.load(seq_chunks + i_n).to(tl.int64)
    c_eos = tl.load(seq_chunks + i_n + 1).to(tl.int64)
    tok0, tok_end = _seq_tokens(chunk_bos, chunk_len, c_bos, c_eos)
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    o_l = tl.arange(0, BL)
    m_k, m_v = o_k < K, o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    o_kv = o_k[:, None] * V + o_v[None, :]
    dt = w.dtype.element_ty

    b_dh = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_FINAL_STATE_GRAD:
        b_dh += tl.load(dht + i_nh.to(tl.int64) * K * V + o_kv, mask=m_kv, other=0).to(tl.float32)
    for i_r in range(0, c_eos - c_bos):
        i_c = c_eos - 1 - i_r
        i_ch = i_c * H + i_h
        tl.store(dh + i_ch * K * V + o_kv, b_dh.to(dh.dtype.element_ty), mask=m_kv)
        bos = tok0 + (i_c - c_bos) * BTC  # chunk c's first token, no load (see _seq_tokens)
        n_tok = tl.minimum(tok_end - bos, BTC)
        m_t = o_t < n_tok
        p_lv = i_ch * BL * V + o_l[:, None] * V + o_v[None, :]
        b_kd = _kd_tile(k, G, bos, n_tok, i_ch, i_h, H, o_l, o_k, m_k, K, NH, BL, USE_G)
        # W^T and Q^T are loaded transposed (K-major), so every product below takes operands as stored
        b_wT = tl.load(w + i_ch * BL * K + o_l[None, :] * K + o_k[:, None], mask=m_k[:, None], other=0)
        b_qT = tl.load(q + ((bos + o_t[None, :]) * H + i_h) * K + o_k[:, None], mask=m_k[:, None] & m_t[None, :],
                       other=0)
        b_do = tl.load(do + ((bos + o_t[:, None]) * H + i_h) * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :],
                       other=0)
        b_Gq = tl.load(G + i_ch * BL + o_t * NH + NH - 1, mask=m_t, other=0)
        b_dv = tl.load(dv_loc + p_lv, mask=m_v[None, :], other=0).to(tl.float32)
        b_dv += tl.dot(b_kd, b_dh.to(dt), input_precision=PREC)
        tl.store(dv_new + p_lv, b_dv.to(dv_new.dtype.element_ty), mask=m_v[None, :])
        b_qg = (b_qT * (scale * tl.exp(b_Gq))[None, :]).to(dt)
        b_dh = b_dh * tl.load(gamma + i_ch) + tl.dot(b_qg, b_do.to(dt), input_precision=PREC) \
            - tl.dot(b_wT, b_dv.to(dt), input_precision=PREC)
    if STORE_INITIAL_STATE_GRAD:
        tl.store(dh0 + i_nh.to(tl.int64) * K * V + o_kv, b_dh.to(dh0.dtype.element_ty), mask=m_kv)


def _grid(V, H, N):
    return lambda meta: (triton.cdiv(V, meta["BV"]), N * H)


def chunk_dp_fwd_h(w, u, k, G, gamma, h0, tab: ChunkTable, output_final_state: bool, state_dtype, prec: str,
                   gated: bool):
    """w [NC,H,BL,K]; u [NC,H,BL,V]; k [NTOK*n,H,K] (the interleaved keys); G [NC,H,BL] (the in-chunk gate cumsum);
    gamma [NC,H]; h0 [N,H,K,V] or None; gated: whether G holds gates (False: Kd = k, G unread).
    Returns h [NC,H,K,V] (state_dtype), v_new [NC,H,BL,V] (u's dtype), ht [N,H,K,V] float32 or None."""
    NC, H, _, K = w.shape
    V = u.shape[-1]
    h = w.new_empty(NC, H, K, V, dtype=state_dtype)
    v_new = torch.empty_like(u)
    ht = w.new_empty(tab.N, H, K, V, dtype=torch.float32) if output_final_state else None
    launch(chunk_dp_fwd_kernel_h, _grid(V, H, tab.N),
        w, u, k, G, gamma, h0, h, v_new, ht, tab.chunk_bos, tab.chunk_len, tab.seq_chunks, H=H, K=K, V=V, NH=tab.n,
        BTC=tab.BT, BL=BL, BK=next_pow2(K), PREC=prec, USE_G=gated)
    return h, v_new, ht


def chunk_dp_bwd_dh(q, do, w, k, gamma, G, dv_loc, dht, tab: ChunkTable, scale: float, need_dh0: bool, prec: str,
                    gated: bool):
    """q [NTOK,H,K], do [NTOK,H,V]; w [NC,H,BL,K]; k [NTOK*n,H,K]; gamma [NC,H]; G [NC,H,BL]; dv_loc [NC,H,BL,V];
    dht [N,H,K,V]; gated: whether G holds gates (Kd = exp(G_L - G) k, else k).
    Returns dh [NC,H,K,V] (gradient w.r.t. the state after each chunk) and dv_new [NC,H,BL,V] in w's dtype, and
    dh0 [N,H,K,V] float32 (None unless need_dh0)."""
    NC, H, _, K = w.shape
    V = do.shape[-1]
    dh = w.new_empty(NC, H, K, V)
    dv_new = w.new_empty(NC, H, BL, V)
    dh0 = w.new_empty(tab.N, H, K, V, dtype=torch.float32) if need_dh0 else None
    launch(chunk_dp_bwd_kernel_dh, _grid(V, H, tab.N),
        q, do, w, k, gamma, G, dv_loc, dht, dh, dv_new, dh0, tab.chunk_bos, tab.chunk_len, tab.seq_chunks, scale,
        H=H, K=K, V=V, NH=tab.n, BT=tab.bt_tile(q.dtype), BTC=tab.BT, BL=BL, BK=next_pow2(K), PREC=prec, USE_G=gated)
    return dh, dv_new, dh0
