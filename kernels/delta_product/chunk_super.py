"""The forward's state walk (and an output kernel) over super-chunks of n chunks (n * BT <= 64 tokens).

chunk_dp_fwd_h_super is the default forward's walk at n_h > 1 when no backward needs the per-chunk states
(inference, evaluation, DPX_KERNEL_SAVE_STATES=0); its output kernel is then chunk_o.chunk_dp_fwd_kernel_o_tok
(DPX_KERNEL_FWD=tok, the default). The pair below (walk + chunk_dp_fwd_kernel_o_super) is the opt-in
DPX_KERNEL_FWD=super, kept as an anchor: its output kernel is slower than o_tok on the H200 (0.344 against 0.218 ms at
n_h 3, session 16).

fla keeps one state per 64 *tokens* for DeltaProduct and computes each 64-token block's output against all of its
64 * n steps; chunk_h / chunk_o keep one state per chunk of 64 *steps* (64 // n tokens). At n_h = 2 the chunk path
therefore writes and reads twice the [K, V] states (268 MB against 134 MB at B=4, T=4096, H=16, d=128) and its
output tiles have 32 query rows, not 64: on the H200 its fwd_h took 0.299 ms and fwd_o 0.238 against fla's 0.180 and
0.170 (BENCHMARKS.md, session 7). This module does it fla's way on dpx's chunks:

  chunk_dp_fwd_kernel_h_super  the serial walk of chunk_h.chunk_dp_fwd_kernel_h (v_new per chunk, unchanged), but the
                               state is stored only at each super-chunk's first chunk: h [NSC, H, K, V]
  chunk_dp_fwd_kernel_o_super  per super-chunk, its <= 64 query tokens at once:
      o_t = scale * (exp(Gq_t) q_t h_s + sum over the super-chunk's steps s <= t*n+n-1 of exp(Gq_t - G_s) (q_t.k_s) v_new_s)
      with G the log gate summed from the super-chunk's start (each chunk's own cumsum plus the G_L of the chunks
      before it). The sum is exact: the state after step s is h_s decayed plus k_r v_new_r^T over the super-chunk's
      steps r <= s, whichever chunk (and so whichever chunk-start state) each v_new_r was computed against.

Only the forward changes: a backward after this walk recomputes the per-chunk states with chunk_h. Verified against
the float64 loop on the interpreter (tests/test_kernels_triton.py) and, as the default no-grad walk, by the H200
acceptance check (benchmarks/gpu_check.py: every case's forward also runs under no_grad).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..utils import autotune_configs, launch, next_pow2
from .chunk_h import _kd_tile, _seq_tokens
from .index import BL, ChunkTable, query_tile


def _h_configs():
    # 3 stages: 0.223 against 0.276 ms at n_h = 2 on the H200 (kernel_configs.py, session 8)
    return autotune_configs([triton.Config({"BV": bv}, num_warps=w, num_stages=s)
                             for bv in (32, 64) for w in (4, 8) for s in (2, 3)], default={"BV": 32})


@triton.heuristics({"USE_INITIAL_STATE": lambda a: a["h0"] is not None,
                    "STORE_FINAL_STATE": lambda a: a["ht"] is not None})
@triton.autotune(configs=_h_configs(), key=["H", "K", "V", "BK", "NS", "PREC", "USE_G"])
@triton.jit(do_not_specialize=["H"])  # H is a runtime stride: one binary for every head count
def chunk_dp_fwd_kernel_h_super(
    w, u, k, G, gamma, h0, h, v_new, ht, chunk_bos, chunk_len, seq_chunks, seq_sc,
    H, K: tl.constexpr, V: tl.constexpr, BL: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NS: tl.constexpr,
    BTC: tl.constexpr, PREC: tl.constexpr, USE_G: tl.constexpr, USE_INITIAL_STATE: tl.constexpr,
    STORE_FINAL_STATE: tl.constexpr,
):
    # NS = n: the chunks of a super-chunk, and the Householder steps of a token (Kd is formed from k: chunk_h._kd_tile)
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // H, i_nh % H
    c_bos = tl.load(seq_chunks + i_n).to(tl.int64)
    c_eos = tl.load(seq_chunks + i_n + 1).to(tl.int64)
    s_bos = tl.load(seq_sc + i_n).to(tl.int64)
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
        if (i_c - c_bos) % NS == 0:  # a super-chunk starts: its state is the one the output kernel reads
            i_sh = (s_bos + (i_c - c_bos) // NS) * H + i_h
            tl.store(h + i_sh * K * V + o_kv, b_h.to(h.dtype.element_ty), mask=m_kv)
        p_lk = i_ch * BL * K + o_l[:, None] * K + o_k[None, :]
        p_lv = i_ch * BL * V + o_l[:, None] * V + o_v[None, :]
        b_w = tl.load(w + p_lk, mask=m_k[None, :], other=0)
        b_u = tl.load(u + p_lv, mask=m_v[None, :], other=0).to(tl.float32)
        b_v = b_u - tl.dot(b_w, b_h.to(b_w.dtype), input_precision=PREC)
        tl.store(v_new + p_lv, b_v.to(v_new.dtype.element_ty), mask=m_v[None, :])
        bos = tok0 + (i_c - c_bos) * BTC
        b_kd = _kd_tile(k, G, bos, tl.minimum(tok_end - bos, BTC), i_ch, i_h, H, o_l, o_k, m_k, K, NS, BL, USE_G)
        b_g = tl.load(gamma + i_ch).to(tl.float32)
        b_h = b_h * b_g + tl.dot(tl.trans(b_kd), b_v.to(b_kd.dtype), input_precision=PREC)
    if STORE_FINAL_STATE:
        tl.store(ht + i_nh.to(tl.int64) * K * V + o_kv, b_h.to(ht.dtype.element_ty), mask=m_kv)


# BV = 32 stays out: with 8 warps it raised an illegal memory access on the H200 (Triton 3.6, n_h 2 and 3, d=128;
# kernel_configs.py, session 8), and with 4 warps it was 1.3-1.8x slower than BV = 64
@triton.autotune(configs=autotune_configs([triton.Config({"BV": bv}, num_warps=w, num_stages=s)
                                           for bv in (64,) for w in (4, 8) for s in (2,)], default={"BV": 64}),
                 key=["H", "K", "V", "NH", "BK", "NS", "PREC"])
@triton.jit(do_not_specialize=["H"])
def chunk_dp_fwd_kernel_o_super(
    q, k, G, h, v_new, o, chunk_bos, sc_chunk0, sc_len, scale,
    H, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr, BT: tl.constexpr, BTQ: tl.constexpr, BL: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, NS: tl.constexpr, PREC: tl.constexpr,
):
    # BT: tokens of a full chunk; BTQ: query rows (a power of two >= NS * BT); NS chunks per super-chunk
    i_v, i_s, i_h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    c0 = tl.load(sc_chunk0 + i_s).to(tl.int64)
    n_tok = tl.load(sc_len + i_s)
    bos = tl.load(chunk_bos + c0).to(tl.int64)  # the super-chunk's chunks hold consecutive tokens from here
    o_t = tl.arange(0, BTQ)
    o_l = tl.arange(0, BL)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_t, m_k, m_v = o_t < n_tok, o_k < K, o_v < V
    j_t = o_t // BT                  # each query token's chunk within the super-chunk
    i_last = o_t * NH + NH - 1       # its last step, counted from the super-chunk's first step

    b_q = tl.load(q + ((bos + o_t[:, None]) * H + i_h) * K + o_k[None, :], mask=m_t[:, None] & m_k[None, :], other=0)
    # Gq from the super-chunk's start: its chunk's own cumsum plus the G_L of the chunks before it
    b_Gq = tl.load(G + ((c0 + j_t) * H + i_h) * BL + (o_t % BT) * NH + NH - 1, mask=m_t, other=0)
    for j in tl.static_range(NS):
        b_gl = tl.load(G + ((c0 + j) * H + i_h) * BL + BL - 1, mask=j * BT < n_tok, other=0)
        b_Gq += tl.where(j_t > j, b_gl, 0)
    b_Gq = tl.where(m_t, b_Gq, 0)  # padding rows: no overflow in exp

    b_h = tl.load(h + (i_s.to(tl.int64) * H + i_h) * K * V + o_k[:, None] * V + o_v[None, :],
                  mask=m_k[:, None] & m_v[None, :], other=0)
    b_o = tl.dot(b_q, b_h.to(b_q.dtype), input_precision=PREC) * tl.exp(b_Gq)[:, None]
    b_off = 0.0  # G_L of the chunks before chunk j
    for j in tl.static_range(NS):
        i_ch = (c0 + j) * H + i_h
        n_tj = tl.minimum(n_tok - j * BT, BT)  # tokens of chunk j (<= 0: the super-chunk has fewer chunks)
        m_l = o_l < n_tj * NH
        b_k = tl.load(k + (((bos + j * BT) * NH + o_l[:, None]) * H + i_h) * K + o_k[None, :],
                      mask=m_l[:, None] & m_k[None, :], other=0)
        b_G = tl.load(G + i_ch * BL + o_l, mask=m_l, other=0) + b_off
        b_vn = tl.load(v_new + i_ch * BL * V + o_l[:, None] * V + o_v[None, :], mask=m_l[:, None] & m_v[None, :],
                       other=0)
        b_s = tl.dot(b_q, tl.trans(b_k), input_precision=PREC)
        m_s = (i_last[:, None] >= (j * BT * NH + o_l)[None, :]) & m_t[:, None] & m_l[None, :]
        b_s = tl.where(m_s, b_s * tl.exp(tl.where(m_s, b_Gq[:, None] - b_G[None, :], 0)), 0)
        b_o += tl.dot(b_s.to(b_vn.dtype), b_vn, input_precision=PREC)
        b_off += tl.load(G + i_ch * BL + BL - 1, mask=n_tj > 0, other=0)
    p_o = o + ((bos + o_t[:, None]) * H + i_h) * V + o_v[None, :]
    tl.store(p_o, (b_o * scale).to(o.dtype.element_ty), mask=m_t[:, None] & m_v[None, :])


def chunk_dp_fwd_h_super(w, u, k, G, gamma, h0, tab: ChunkTable, output_final_state: bool, state_dtype, prec: str,
                         gated: bool):
    """The state walk alone, one state per super-chunk: w [NC,H,BL,K], u [NC,H,BL,V], k [NTOK*n,H,K], G [NC,H,BL],
    gamma [NC,H], h0 [N,H,K,V] or None -> h [NSC,H,K,V] (state_dtype), v_new [NC,H,BL,V], the final state
    [N,H,K,V] float32 (or None). The default forward's walk when no backward needs the per-chunk states."""
    NC, H, _, K = w.shape
    V = u.shape[-1]
    h = w.new_empty(tab.NSC, H, K, V, dtype=state_dtype)
    v_new = torch.empty_like(u)
    ht = w.new_empty(tab.N, H, K, V, dtype=torch.float32) if output_final_state else None
    launch(chunk_dp_fwd_kernel_h_super, lambda meta: (triton.cdiv(V, meta["BV"]), tab.N * H),
           w, u, k, G, gamma, h0, h, v_new, ht, tab.chunk_bos, tab.chunk_len, tab.seq_chunks, tab.seq_sc, H=H, K=K,
           V=V, BL=BL, BK=next_pow2(K), NS=tab.n, BTC=tab.BT, PREC=prec, USE_G=gated)
    return h, v_new, ht


def chunk_dp_fwd_h_o_super(q, k, w, u, gamma, G, h0, tab: ChunkTable, scale: float, output_final_state: bool,
                           prec: str, gated: bool):
    """chunk_h.chunk_dp_fwd_h + chunk_o.chunk_dp_fwd_o over super-chunks: q [NTOK,H,K], k [NTOK*n,H,K], w
    [NC,H,BL,K], u [NC,H,BL,V], gamma [NC,H], G [NC,H,BL], h0 [N,H,K,V] or None; gated: whether G holds gates.
    Returns o [NTOK,H,V] (q's dtype) and the final state [N,H,K,V] float32 (or None)."""
    NTOK, H, K = q.shape
    V = u.shape[-1]
    h, v_new, ht = chunk_dp_fwd_h_super(w, u, k, G, gamma, h0, tab, output_final_state, q.dtype, prec, gated)
    o = q.new_empty(NTOK, H, V)
    launch(chunk_dp_fwd_kernel_o_super, lambda meta: (triton.cdiv(V, meta["BV"]), tab.NSC, H),
        q, k, G, h, v_new, o, tab.chunk_bos, tab.sc_chunk0, tab.sc_len, scale, H=H, K=K, V=V, NH=tab.n, BT=tab.BT,
        BTQ=query_tile(tab.n * tab.BT, q.dtype), BL=BL, BK=next_pow2(K), NS=tab.n, PREC=prec)
    return o, ht
