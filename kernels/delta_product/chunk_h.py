"""The serial part of the chunkwise algorithm: the state recurrence across chunks, forward and backward.

Per sequence and head, over its chunks c (S = state at the chunk start, stored as h[c]):
    v_new_c = U_c - W_c S
    S       = gamma_c S + Kd_c^T v_new_c
One program owns a [K, BV] slice of the state of one (sequence, head) and walks its chunks.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..utils import autotune_configs, next_pow2
from .index import BL, ChunkTable


def _configs():
    return autotune_configs([triton.Config({"BV": bv}, num_warps=w, num_stages=s)
                             for bv in (32, 64) for w in (4, 8) for s in (2,)], default={"BV": 32})


@triton.heuristics({"USE_INITIAL_STATE": lambda a: a["h0"] is not None,
                    "STORE_FINAL_STATE": lambda a: a["ht"] is not None})
@triton.autotune(configs=_configs(), key=["H", "K", "V", "BK", "PREC"])
@triton.jit
def chunk_dp_fwd_kernel_h(
    w, u, kd, gamma, h0, h, v_new, ht, seq_chunks,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BL: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    PREC: tl.constexpr, USE_INITIAL_STATE: tl.constexpr, STORE_FINAL_STATE: tl.constexpr,
):
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // H, i_nh % H
    c_bos = tl.load(seq_chunks + i_n).to(tl.int64)
    c_eos = tl.load(seq_chunks + i_n + 1).to(tl.int64)
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
        b_kd = tl.load(kd + p_lk, mask=m_k[None, :], other=0)
        b_g = tl.load(gamma + i_ch).to(tl.float32)
        b_h = b_h * b_g + tl.dot(tl.trans(b_kd), b_v.to(b_kd.dtype), input_precision=PREC)
    if STORE_FINAL_STATE:
        tl.store(ht + i_nh.to(tl.int64) * K * V + o_kv, b_h.to(ht.dtype.element_ty), mask=m_kv)


@triton.heuristics({"USE_FINAL_STATE_GRAD": lambda a: a["dht"] is not None})
@triton.autotune(configs=autotune_configs([triton.Config({}, num_warps=w, num_stages=s) for w in (4, 8) for s in (2,)]),
                 key=["H", "K", "V", "BK", "BV", "PREC"])
@triton.jit
def chunk_dp_bwd_kernel_dh(
    w, kd, gamma, h, v_new, dh, dv_new, dht, dh0, du, dw, dkd, dgamma, seq_chunks, NC,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BL: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    PREC: tl.constexpr, USE_FINAL_STATE_GRAD: tl.constexpr,
):
    # reverse walk; dw, dkd, dgamma get one partial per V slice (summed on the host), du is complete per slice
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // H, i_nh % H
    c_bos = tl.load(seq_chunks + i_n).to(tl.int64)
    c_eos = tl.load(seq_chunks + i_n + 1).to(tl.int64)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    o_l = tl.arange(0, BL)
    m_k, m_v = o_k < K, o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    o_kv = o_k[:, None] * V + o_v[None, :]

    b_dh = tl.zeros([BK, BV], dtype=tl.float32)  # gradient w.r.t. the state after the current chunk
    if USE_FINAL_STATE_GRAD:
        b_dh += tl.load(dht + i_nh.to(tl.int64) * K * V + o_kv, mask=m_kv, other=0).to(tl.float32)
    for i_r in range(0, c_eos - c_bos):
        i_c = c_eos - 1 - i_r
        i_ch = i_c * H + i_h
        p_lk = i_ch * BL * K + o_l[:, None] * K + o_k[None, :]
        p_lv = i_ch * BL * V + o_l[:, None] * V + o_v[None, :]
        b_h = tl.load(h + i_ch * K * V + o_kv, mask=m_kv, other=0).to(tl.float32)
        b_v = tl.load(v_new + p_lv, mask=m_v[None, :], other=0).to(tl.float32)
        b_kd = tl.load(kd + p_lk, mask=m_k[None, :], other=0).to(tl.float32)
        b_w = tl.load(w + p_lk, mask=m_k[None, :], other=0).to(tl.float32)
        b_g = tl.load(gamma + i_ch).to(tl.float32)
        # S_next = g S + Kd^T v_new  and  v_new = U - W S
        b_du = tl.load(dv_new + p_lv, mask=m_v[None, :], other=0).to(tl.float32)
        b_du += tl.dot(b_kd, b_dh, input_precision=PREC)
        tl.store(du + p_lv, b_du, mask=m_v[None, :])
        p_part = (i_v * NC * H + i_ch) * BL * K + o_l[:, None] * K + o_k[None, :]
        tl.store(dkd + p_part, tl.dot(b_v, tl.trans(b_dh), input_precision=PREC), mask=m_k[None, :])
        tl.store(dw + p_part, -tl.dot(b_du, tl.trans(b_h), input_precision=PREC), mask=m_k[None, :])
        tl.store(dgamma + i_v * NC * H + i_ch, tl.sum(tl.sum(b_h * b_dh, 1), 0))
        b_dh = b_dh * b_g - tl.dot(tl.trans(b_w), b_du, input_precision=PREC)
        b_dh += tl.load(dh + i_ch * K * V + o_kv, mask=m_kv, other=0).to(tl.float32)
    tl.store(dh0 + i_nh.to(tl.int64) * K * V + o_kv, b_dh, mask=m_kv)


def _grid(V, H, N):
    return lambda meta: (triton.cdiv(V, meta["BV"]), N * H)


def chunk_dp_fwd_h(w, u, kd, gamma, h0, tab: ChunkTable, output_final_state: bool, state_dtype, prec: str):
    """w, kd [NC,H,BL,K]; u [NC,H,BL,V]; gamma [NC,H]; h0 [N,H,K,V] or None.
    Returns h [NC,H,K,V] (state_dtype), v_new [NC,H,BL,V] (u's dtype), ht [N,H,K,V] float32 or None."""
    NC, H, _, K = w.shape
    V = u.shape[-1]
    h = w.new_empty(NC, H, K, V, dtype=state_dtype)
    v_new = torch.empty_like(u)
    ht = w.new_empty(tab.N, H, K, V, dtype=torch.float32) if output_final_state else None
    chunk_dp_fwd_kernel_h[_grid(V, H, tab.N)](
        w, u, kd, gamma, h0, h, v_new, ht, tab.seq_chunks, H=H, K=K, V=V, BL=BL, BK=next_pow2(K), PREC=prec)
    return h, v_new, ht


def chunk_dp_bwd_dh(w, kd, gamma, h, v_new, dh, dv_new, dht, tab: ChunkTable, prec: str):
    """Gradients of the recurrence (all float32): du [NC,H,BL,V], dw, dkd [NC,H,BL,K], dgamma [NC,H], dh0 [N,H,K,V]."""
    NC, H, _, K = w.shape
    V = v_new.shape[-1]
    BK = next_pow2(K)
    BV = min(64, next_pow2(V))
    NV = triton.cdiv(V, BV)
    du = torch.empty(NC, H, BL, V, dtype=torch.float32, device=w.device)
    dw = w.new_empty(NV, NC, H, BL, K, dtype=torch.float32)
    dkd = torch.empty_like(dw)
    dgamma = w.new_empty(NV, NC, H, dtype=torch.float32)
    dh0 = w.new_empty(tab.N, H, K, V, dtype=torch.float32)
    chunk_dp_bwd_kernel_dh[(NV, tab.N * H)](
        w, kd, gamma, h, v_new, dh, dv_new, dht, dh0, du, dw, dkd, dgamma, tab.seq_chunks, NC,
        H=H, K=K, V=V, BL=BL, BK=BK, BV=BV, PREC=prec)
    return du, dw.sum(0), dkd.sum(0), dgamma.sum(0), dh0


class StateRecurrence(torch.autograd.Function):
    """(W, U, Kd, gamma, h0) -> (h per chunk, v_new, final state), float32 throughout; used by the backward."""

    @staticmethod
    def forward(ctx, w, u, kd, gamma, h0, tab, prec):
        w, u, kd, gamma = w.contiguous(), u.contiguous(), kd.contiguous(), gamma.contiguous()
        h0 = None if h0 is None else h0.contiguous()
        h, v_new, ht = chunk_dp_fwd_h(w, u, kd, gamma, h0, tab, True, torch.float32, prec)
        ctx.save_for_backward(w, kd, gamma, h, v_new)
        ctx.tab, ctx.prec, ctx.has_h0 = tab, prec, h0 is not None
        return h, v_new, ht

    @staticmethod
    def backward(ctx, dh, dv_new, dht):
        w, kd, gamma, h, v_new = ctx.saved_tensors
        dh = torch.zeros_like(h) if dh is None else dh.contiguous()
        dv_new = torch.zeros_like(v_new) if dv_new is None else dv_new.contiguous()
        dht = None if dht is None else dht.contiguous()
        du, dw, dkd, dgamma, dh0 = chunk_dp_bwd_dh(w, kd, gamma, h, v_new, dh, dv_new, dht, ctx.tab, ctx.prec)
        return dw, du, dkd, dgamma, (dh0 if ctx.has_h0 else None), None, None
