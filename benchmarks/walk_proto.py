"""Prototype: the forward state walk with the state split into 64-wide K tiles (fla's blockdim64 layout).

    python3 benchmarks/walk_proto.py [--out DIR] [--budget-s 55]       # on one CUDA GPU, ~1 minute
    python3 benchmarks/walk_proto.py --resources [--out DIR]           # CPU: AOT compile for sm_90, regs / spills

Same inputs and outputs as kernels/delta_product/chunk_h.py's `chunk_dp_fwd_kernel_h` (per sequence and head, over
its chunks c, S = the state at the chunk start, stored as h[c]):
    v_new_c = U_c - W_c S
    S       = gamma_c S + Kd_c^T v_new_c
What differs from chunk_dp_fwd_kernel_h (one [BK, BV] float32 tile, BK = next_pow2(K), int64 tensor addresses):
  * the state is 1-4 register tiles of [KT, BV], KT = 64 (KT = next_pow2(K) when K <= 32), one per 64 rows of K,
    with constexpr branches `if K > KT`, ... (K up to 256); W S is a chain of per-tile dots accumulating into one
    [BL, BV] tile (tl.dot(..., acc)), and each tile's update is its own dot with the decayed state as accumulator;
  * every load and store goes through tl.make_block_ptr: a scalar int64 base per chunk and int32 tile offsets
    (chunk_h builds an int64 address per element: i_ch * BL * K + o_l * K + o_k), with boundary_check only on the
    dims that can be partial (the last K tile when K % KT != 0, V when V % BV != 0), zero padding;
  * Kd^T is loaded K-major ([KT, BL], order (0, 1)) so the update dot takes it as stored (no tl.trans);
  * its own autotune space: BV in 32/64 x warps 2/4/8 x stages 1-4 (24 configs).
Second variant, `walk_fwd_h_split_k`: takes the interleaved keys k [NTOK*n, H, K] and the in-chunk gate cumsum G
[NC, H, BL] (None when not gated) instead of kd, and forms Kd = (k * exp(G_last - G)).to(dtype) in the walk, the
very expression (same operands, same float32 ops, one rounding) chunk_dp_fwd_kernel_wu stores as kd; rows past the
chunk's steps (padding) load as zero, as wu's masked k does. Without gates Kd = k (wu multiplies by exp(0) = 1).
main() checks it bit for bit against the kd variant on the GPU.

Third variant, `walk_fwd_h_split_pf`: the split walk with the next chunk's W / U / Kd tiles loaded into registers
(loop-carried) before the current chunk's dots (written when the CPU compile showed no async copies at any
num_stages, an artefact of compiling without the JIT's alignment hints: a real launch of dpx's walk is pipelined);
4 configs (BV 32/64 x 4/8 warps).

Nothing here is used by dpx's kernels; kernels/ is untouched. Imports: torch, triton, numpy and dpx.kernels only.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
try:
    import dpx.kernels  # noqa: F401
    from dpx.kernels.delta_product.chunk_h import _kd_tile, chunk_dp_fwd_h, chunk_dp_fwd_kernel_h  # noqa: F401
except ImportError:  # repo checkout without `pip install -e .`: expose kernels/ as dpx.kernels
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from dpx_checkout import expose_kernels
    expose_kernels()
    from dpx.kernels.delta_product.chunk_h import _kd_tile, chunk_dp_fwd_h, chunk_dp_fwd_kernel_h  # noqa: F401

from dpx.kernels.delta_product.index import BL, ChunkTable  # noqa: E402
from dpx.kernels.utils import INTERPRET, autotune_configs, autotuner, launch, next_pow2  # noqa: E402

CONFIGS = [triton.Config({"BV": bv}, num_warps=w, num_stages=s) for bv in (32, 64) for w in (2, 4, 8)
           for s in (1, 2, 3, 4)]


def _configs():
    return autotune_configs(CONFIGS, default={"BV": 32})


def k_tile(K: int) -> int:
    """Rows of one state tile: 64, or the next power of two (>= 16) for K <= 32."""
    return min(64, next_pow2(K))


# -- block-pointer access with the boundary checks a tile needs (C0, C1: whether dim 0 / dim 1 can be partial) ----

@triton.jit
def _ld(p, C0: tl.constexpr, C1: tl.constexpr):
    if C0:
        if C1:
            x = tl.load(p, boundary_check=(0, 1), padding_option="zero")
        else:
            x = tl.load(p, boundary_check=(0,), padding_option="zero")
    else:
        if C1:
            x = tl.load(p, boundary_check=(1,), padding_option="zero")
        else:
            x = tl.load(p)
    return x


@triton.jit
def _st(p, x, C0: tl.constexpr, C1: tl.constexpr):
    if C0:
        if C1:
            tl.store(p, x, boundary_check=(0, 1))
        else:
            tl.store(p, x, boundary_check=(0,))
    else:
        if C1:
            tl.store(p, x, boundary_check=(1,))
        else:
            tl.store(p, x)


@triton.jit
def _state_ld(p, k0, i_v, K: tl.constexpr, V: tl.constexpr, KT: tl.constexpr, BV: tl.constexpr):
    # rows k0 .. k0+KT of a [K, V] state (h0)
    b = _ld(tl.make_block_ptr(p, (K, V), (V, 1), (k0, i_v * BV), (KT, BV), (1, 0)), k0 + KT > K, V % BV != 0)
    return b.to(tl.float32)


@triton.jit
def _state_st(p, b, k0, i_v, K: tl.constexpr, V: tl.constexpr, KT: tl.constexpr, BV: tl.constexpr):
    _st(tl.make_block_ptr(p, (K, V), (V, 1), (k0, i_v * BV), (KT, BV), (1, 0)), b.to(p.dtype.element_ty),
        k0 + KT > K, V % BV != 0)


@triton.jit
def _w_dot(p_w, b_h, b_acc, k0, K: tl.constexpr, BL: tl.constexpr, KT: tl.constexpr, PREC: tl.constexpr,
           FIRST: tl.constexpr):
    # W[:, k0:k0+KT] @ S[k0:k0+KT] (+ b_acc): [BL, KT] x [KT, BV]
    b_w = _ld(tl.make_block_ptr(p_w, (BL, K), (K, 1), (0, k0), (BL, KT), (1, 0)), False, k0 + KT > K)
    if FIRST:
        r = tl.dot(b_w, b_h.to(b_w.dtype), input_precision=PREC)
    else:
        r = tl.dot(b_w, b_h.to(b_w.dtype), b_acc, input_precision=PREC)
    return r


@triton.jit
def _kd_T(p_kd, p_k, n_k, b_e, k0, H, K: tl.constexpr, BL: tl.constexpr, KT: tl.constexpr,
          FROM_K: tl.constexpr, USE_G: tl.constexpr):
    # Kd[:, k0:k0+KT]^T as a K-major [KT, BL] tile: the A operand of the update, taken as stored
    if FROM_K:
        # k rows of this chunk's steps (n_k of them; the rest, padding, load as zero), K-major
        b = tl.load(tl.make_block_ptr(p_k, (K, n_k), (1, H * K), (k0, 0), (KT, BL), (0, 1)),
                    boundary_check=(0, 1), padding_option="zero")
        if USE_G:
            b = (b * b_e[None, :]).to(b.dtype)  # chunk_dp_fwd_kernel_wu's kd: (k * exp(G_last - G)).to(dtype)
    else:
        b = _ld(tl.make_block_ptr(p_kd, (K, BL), (1, K), (k0, 0), (KT, BL), (0, 1)), k0 + KT > K, False)
    return b


@triton.jit
def _walk(w, u, kd, k, G, gamma, h0, h, v_new, ht, seq_chunks, chunk_bos, chunk_len, H,
          K: tl.constexpr, V: tl.constexpr, BL: tl.constexpr, KT: tl.constexpr, BV: tl.constexpr,
          PREC: tl.constexpr, NH: tl.constexpr, BT: tl.constexpr, FROM_K: tl.constexpr, USE_G: tl.constexpr,
          USE_INITIAL_STATE: tl.constexpr, STORE_FINAL_STATE: tl.constexpr):
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // H, i_nh % H
    c_bos = tl.load(seq_chunks + i_n).to(tl.int64)
    c_eos = tl.load(seq_chunks + i_n + 1).to(tl.int64)
    MV: tl.constexpr = V % BV != 0

    b_h1 = tl.zeros([KT, BV], dtype=tl.float32)
    if K > KT:
        b_h2 = tl.zeros([KT, BV], dtype=tl.float32)
    if K > 2 * KT:
        b_h3 = tl.zeros([KT, BV], dtype=tl.float32)
    if K > 3 * KT:
        b_h4 = tl.zeros([KT, BV], dtype=tl.float32)
    if USE_INITIAL_STATE:
        p_h0 = h0 + i_nh.to(tl.int64) * K * V
        b_h1 += _state_ld(p_h0, 0, i_v, K, V, KT, BV)
        if K > KT:
            b_h2 += _state_ld(p_h0, KT, i_v, K, V, KT, BV)
        if K > 2 * KT:
            b_h3 += _state_ld(p_h0, 2 * KT, i_v, K, V, KT, BV)
        if K > 3 * KT:
            b_h4 += _state_ld(p_h0, 3 * KT, i_v, K, V, KT, BV)

    if FROM_K:
        # the sequence's chunks are consecutive BT-token runs from its first chunk's first token: no per-chunk loads
        has = c_eos > c_bos
        tok0 = tl.load(chunk_bos + c_bos, mask=has, other=0).to(tl.int64)
        c_last = tl.maximum(c_eos - 1, c_bos)
        tok_end = tl.load(chunk_bos + c_last, mask=has, other=0).to(tl.int64) + \
            tl.load(chunk_len + c_last, mask=has, other=0).to(tl.int64)
    for i_c in range(c_bos, c_eos):
        i_ch = i_c * H + i_h
        p_h = h + i_ch * K * V
        _state_st(p_h, b_h1, 0, i_v, K, V, KT, BV)
        if K > KT:
            _state_st(p_h, b_h2, KT, i_v, K, V, KT, BV)
        if K > 2 * KT:
            _state_st(p_h, b_h3, 2 * KT, i_v, K, V, KT, BV)
        if K > 3 * KT:
            _state_st(p_h, b_h4, 3 * KT, i_v, K, V, KT, BV)

        p_w = w + i_ch * BL * K
        b_v = _w_dot(p_w, b_h1, None, 0, K, BL, KT, PREC, True)
        if K > KT:
            b_v = _w_dot(p_w, b_h2, b_v, KT, K, BL, KT, PREC, False)
        if K > 2 * KT:
            b_v = _w_dot(p_w, b_h3, b_v, 2 * KT, K, BL, KT, PREC, False)
        if K > 3 * KT:
            b_v = _w_dot(p_w, b_h4, b_v, 3 * KT, K, BL, KT, PREC, False)
        p_u = tl.make_block_ptr(u + i_ch * BL * V, (BL, V), (V, 1), (0, i_v * BV), (BL, BV), (1, 0))
        b_v = _ld(p_u, False, MV).to(tl.float32) - b_v
        p_vn = tl.make_block_ptr(v_new + i_ch * BL * V, (BL, V), (V, 1), (0, i_v * BV), (BL, BV), (1, 0))
        _st(p_vn, b_v.to(v_new.dtype.element_ty), False, MV)
        b_vd = b_v.to(w.dtype.element_ty)
        b_g = tl.load(gamma + i_ch).to(tl.float32)

        p_kd = kd
        p_k = k
        n_k = 0
        b_e = tl.full([BL], 1.0, dtype=tl.float32)  # the decay of each row (used only with FROM_K and USE_G)
        if FROM_K:
            s0 = (tok0 + (i_c - c_bos) * BT) * NH  # the chunk's first interleaved step
            p_k = k + (s0 * H + i_h) * K
            n_k = tl.minimum(tok_end * NH - s0, BT * NH).to(tl.int32)  # its steps (BT * NH but at the end)
            if USE_G:
                b_G = tl.load(G + i_ch * BL + tl.arange(0, BL))
                b_e = tl.exp(tl.load(G + i_ch * BL + BL - 1) - b_G)
        else:
            p_kd = kd + i_ch * BL * K
        b_h1 = tl.dot(_kd_T(p_kd, p_k, n_k, b_e, 0, H, K, BL, KT, FROM_K, USE_G), b_vd, b_h1 * b_g,
                      input_precision=PREC)
        if K > KT:
            b_h2 = tl.dot(_kd_T(p_kd, p_k, n_k, b_e, KT, H, K, BL, KT, FROM_K, USE_G), b_vd, b_h2 * b_g,
                          input_precision=PREC)
        if K > 2 * KT:
            b_h3 = tl.dot(_kd_T(p_kd, p_k, n_k, b_e, 2 * KT, H, K, BL, KT, FROM_K, USE_G), b_vd, b_h3 * b_g,
                          input_precision=PREC)
        if K > 3 * KT:
            b_h4 = tl.dot(_kd_T(p_kd, p_k, n_k, b_e, 3 * KT, H, K, BL, KT, FROM_K, USE_G), b_vd, b_h4 * b_g,
                          input_precision=PREC)

    if STORE_FINAL_STATE:
        p_ht = ht + i_nh.to(tl.int64) * K * V
        _state_st(p_ht, b_h1, 0, i_v, K, V, KT, BV)
        if K > KT:
            _state_st(p_ht, b_h2, KT, i_v, K, V, KT, BV)
        if K > 2 * KT:
            _state_st(p_ht, b_h3, 2 * KT, i_v, K, V, KT, BV)
        if K > 3 * KT:
            _state_st(p_ht, b_h4, 3 * KT, i_v, K, V, KT, BV)


@triton.heuristics({"USE_INITIAL_STATE": lambda a: a["h0"] is not None,
                    "STORE_FINAL_STATE": lambda a: a["ht"] is not None})
@triton.autotune(configs=_configs(), key=["H", "K", "V", "KT", "PREC"])
@triton.jit(do_not_specialize=["H"])
def walk_fwd_h_split(
    w, u, kd, gamma, h0, h, v_new, ht, seq_chunks,
    H, K: tl.constexpr, V: tl.constexpr, BL: tl.constexpr, KT: tl.constexpr, BV: tl.constexpr,
    PREC: tl.constexpr, USE_INITIAL_STATE: tl.constexpr, STORE_FINAL_STATE: tl.constexpr,
):
    _walk(w, u, kd, None, None, gamma, h0, h, v_new, ht, seq_chunks, None, None, H, K, V, BL, KT, BV, PREC,
          1, BL, False, False, USE_INITIAL_STATE, STORE_FINAL_STATE)


@triton.heuristics({"USE_G": lambda a: a["G"] is not None,
                    "USE_INITIAL_STATE": lambda a: a["h0"] is not None,
                    "STORE_FINAL_STATE": lambda a: a["ht"] is not None})
@triton.autotune(configs=_configs(), key=["H", "K", "V", "KT", "NH", "PREC", "USE_G"])
@triton.jit(do_not_specialize=["H"])
def walk_fwd_h_split_k(
    w, u, k, G, gamma, h0, h, v_new, ht, seq_chunks, chunk_bos, chunk_len,
    H, K: tl.constexpr, V: tl.constexpr, BL: tl.constexpr, KT: tl.constexpr, BV: tl.constexpr,
    NH: tl.constexpr, BT: tl.constexpr, PREC: tl.constexpr, USE_G: tl.constexpr,
    USE_INITIAL_STATE: tl.constexpr, STORE_FINAL_STATE: tl.constexpr,
):
    _walk(w, u, None, k, G, gamma, h0, h, v_new, ht, seq_chunks, chunk_bos, chunk_len, H, K, V, BL, KT, BV, PREC,
          NH, BT, True, USE_G, USE_INITIAL_STATE, STORE_FINAL_STATE)


@triton.jit
def _w_tile(p_w, k0, K: tl.constexpr, BL: tl.constexpr, KT: tl.constexpr):
    return _ld(tl.make_block_ptr(p_w, (BL, K), (K, 1), (0, k0), (BL, KT), (1, 0)), False, k0 + KT > K)


@triton.jit
def _kdT_tile(p_kd, k0, K: tl.constexpr, BL: tl.constexpr, KT: tl.constexpr):
    return _ld(tl.make_block_ptr(p_kd, (K, BL), (1, K), (k0, 0), (KT, BL), (0, 1)), k0 + KT > K, False)


@triton.jit
def _u_tile(p_u, i_v, V: tl.constexpr, BL: tl.constexpr, BV: tl.constexpr):
    return _ld(tl.make_block_ptr(p_u, (BL, V), (V, 1), (0, i_v * BV), (BL, BV), (1, 0)), False, V % BV != 0)


# Written when the CPU compile (kernel_resources.py without the JIT's alignment hints) showed no async copies at any
# num_stages; compiled as a real launch is (16-byte aligned pointers), Triton does pipeline dpx's forward walk (its
# shared memory grows with the stages: cp.async), so this variant is a comparison, not a fix. It pipelines by hand:
# the tiles of chunk c+1 are loaded (into registers) while chunk c's two dependent dots run.
PF_CONFIGS = [triton.Config({"BV": bv}, num_warps=w, num_stages=1) for bv in (32, 64) for w in (4, 8)]


@triton.heuristics({"USE_INITIAL_STATE": lambda a: a["h0"] is not None,
                    "STORE_FINAL_STATE": lambda a: a["ht"] is not None})
@triton.autotune(configs=autotune_configs(PF_CONFIGS, default={"BV": 32}), key=["H", "K", "V", "KT", "PREC"])
@triton.jit(do_not_specialize=["H"])
def walk_fwd_h_split_pf(
    w, u, kd, gamma, h0, h, v_new, ht, seq_chunks,
    H, K: tl.constexpr, V: tl.constexpr, BL: tl.constexpr, KT: tl.constexpr, BV: tl.constexpr,
    PREC: tl.constexpr, USE_INITIAL_STATE: tl.constexpr, STORE_FINAL_STATE: tl.constexpr,
):
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // H, i_nh % H
    c_bos = tl.load(seq_chunks + i_n).to(tl.int64)
    c_eos = tl.load(seq_chunks + i_n + 1).to(tl.int64)
    MV: tl.constexpr = V % BV != 0
    b_h1 = tl.zeros([KT, BV], dtype=tl.float32)
    if K > KT:
        b_h2 = tl.zeros([KT, BV], dtype=tl.float32)
    if K > 2 * KT:
        b_h3 = tl.zeros([KT, BV], dtype=tl.float32)
    if K > 3 * KT:
        b_h4 = tl.zeros([KT, BV], dtype=tl.float32)
    if USE_INITIAL_STATE:
        p_h0 = h0 + i_nh.to(tl.int64) * K * V
        b_h1 += _state_ld(p_h0, 0, i_v, K, V, KT, BV)
        if K > KT:
            b_h2 += _state_ld(p_h0, KT, i_v, K, V, KT, BV)
        if K > 2 * KT:
            b_h3 += _state_ld(p_h0, 2 * KT, i_v, K, V, KT, BV)
        if K > 3 * KT:
            b_h4 += _state_ld(p_h0, 3 * KT, i_v, K, V, KT, BV)
    # chunk c_bos's tiles (an empty sequence loads a neighbour's chunk and never uses it)
    i_pf = tl.maximum(tl.minimum(c_bos, c_eos - 1), 0) * H + i_h
    p_w = w + i_pf * BL * K
    p_kd = kd + i_pf * BL * K
    n_w1 = _w_tile(p_w, 0, K, BL, KT)
    n_k1 = _kdT_tile(p_kd, 0, K, BL, KT)
    if K > KT:
        n_w2 = _w_tile(p_w, KT, K, BL, KT)
        n_k2 = _kdT_tile(p_kd, KT, K, BL, KT)
    if K > 2 * KT:
        n_w3 = _w_tile(p_w, 2 * KT, K, BL, KT)
        n_k3 = _kdT_tile(p_kd, 2 * KT, K, BL, KT)
    if K > 3 * KT:
        n_w4 = _w_tile(p_w, 3 * KT, K, BL, KT)
        n_k4 = _kdT_tile(p_kd, 3 * KT, K, BL, KT)
    n_u = _u_tile(u + i_pf * BL * V, i_v, V, BL, BV)
    n_g = tl.load(gamma + i_pf).to(tl.float32)
    for i_c in range(c_bos, c_eos):
        i_ch = i_c * H + i_h
        b_w1, b_k1, b_u, b_g = n_w1, n_k1, n_u, n_g
        if K > KT:
            b_w2, b_k2 = n_w2, n_k2
        if K > 2 * KT:
            b_w3, b_k3 = n_w3, n_k3
        if K > 3 * KT:
            b_w4, b_k4 = n_w4, n_k4
        # the next chunk's tiles (the last step reloads its own), issued before this step's dots
        i_nx = tl.minimum(i_c + 1, c_eos - 1) * H + i_h
        p_w = w + i_nx * BL * K
        p_kd = kd + i_nx * BL * K
        n_w1 = _w_tile(p_w, 0, K, BL, KT)
        n_k1 = _kdT_tile(p_kd, 0, K, BL, KT)
        if K > KT:
            n_w2 = _w_tile(p_w, KT, K, BL, KT)
            n_k2 = _kdT_tile(p_kd, KT, K, BL, KT)
        if K > 2 * KT:
            n_w3 = _w_tile(p_w, 2 * KT, K, BL, KT)
            n_k3 = _kdT_tile(p_kd, 2 * KT, K, BL, KT)
        if K > 3 * KT:
            n_w4 = _w_tile(p_w, 3 * KT, K, BL, KT)
            n_k4 = _kdT_tile(p_kd, 3 * KT, K, BL, KT)
        n_u = _u_tile(u + i_nx * BL * V, i_v, V, BL, BV)
        n_g = tl.load(gamma + i_nx).to(tl.float32)

        p_h = h + i_ch * K * V
        _state_st(p_h, b_h1, 0, i_v, K, V, KT, BV)
        if K > KT:
            _state_st(p_h, b_h2, KT, i_v, K, V, KT, BV)
        if K > 2 * KT:
            _state_st(p_h, b_h3, 2 * KT, i_v, K, V, KT, BV)
        if K > 3 * KT:
            _state_st(p_h, b_h4, 3 * KT, i_v, K, V, KT, BV)
        b_v = tl.dot(b_w1, b_h1.to(b_w1.dtype), input_precision=PREC)
        if K > KT:
            b_v = tl.dot(b_w2, b_h2.to(b_w2.dtype), b_v, input_precision=PREC)
        if K > 2 * KT:
            b_v = tl.dot(b_w3, b_h3.to(b_w3.dtype), b_v, input_precision=PREC)
        if K > 3 * KT:
            b_v = tl.dot(b_w4, b_h4.to(b_w4.dtype), b_v, input_precision=PREC)
        b_v = b_u.to(tl.float32) - b_v
        p_vn = tl.make_block_ptr(v_new + i_ch * BL * V, (BL, V), (V, 1), (0, i_v * BV), (BL, BV), (1, 0))
        _st(p_vn, b_v.to(v_new.dtype.element_ty), False, MV)
        b_vd = b_v.to(w.dtype.element_ty)
        b_h1 = tl.dot(b_k1, b_vd, b_h1 * b_g, input_precision=PREC)
        if K > KT:
            b_h2 = tl.dot(b_k2, b_vd, b_h2 * b_g, input_precision=PREC)
        if K > 2 * KT:
            b_h3 = tl.dot(b_k3, b_vd, b_h3 * b_g, input_precision=PREC)
        if K > 3 * KT:
            b_h4 = tl.dot(b_k4, b_vd, b_h4 * b_g, input_precision=PREC)
    if STORE_FINAL_STATE:
        p_ht = ht + i_nh.to(tl.int64) * K * V
        _state_st(p_ht, b_h1, 0, i_v, K, V, KT, BV)
        if K > KT:
            _state_st(p_ht, b_h2, KT, i_v, K, V, KT, BV)
        if K > 2 * KT:
            _state_st(p_ht, b_h3, 2 * KT, i_v, K, V, KT, BV)
        if K > 3 * KT:
            _state_st(p_ht, b_h4, 3 * KT, i_v, K, V, KT, BV)


def _grid(V, H, N):
    return lambda meta: (triton.cdiv(V, meta["BV"]), N * H)


@triton.jit
def _kd_store_kernel(k, G, kd, chunk_bos, chunk_len, H, K: tl.constexpr, NH: tl.constexpr, BL: tl.constexpr,
                     BK: tl.constexpr, USE_G: tl.constexpr):
    i_c, i_h = tl.program_id(0), tl.program_id(1)
    i_ch = i_c.to(tl.int64) * H + i_h
    o_l, o_k = tl.arange(0, BL), tl.arange(0, BK)
    m_k = o_k < K
    bos = tl.load(chunk_bos + i_c).to(tl.int64)
    b = _kd_tile(k, G, bos, tl.load(chunk_len + i_c), i_ch, i_h, H, o_l, o_k, m_k, K, NH, BL, USE_G)
    tl.store(kd + i_ch * BL * K + o_l[:, None] * K + o_k[None, :], b, mask=m_k[None, :])


def kd_tensor(k, G, tab: ChunkTable, gated: bool):
    """Kd [NC,H,BL,K] as dpx's walks form it (chunk_h._kd_tile, bit for bit), for the prototypes that take kd."""
    _, H, K = k.shape
    kd = k.new_empty(tab.NC, H, BL, K)
    if tab.NC:
        launch(_kd_store_kernel, (tab.NC, H), k, G, kd, tab.chunk_bos, tab.chunk_len, H, K=K, NH=tab.n, BL=BL,
               BK=next_pow2(K), USE_G=gated)
    return kd


def _outputs(w, u, tab, output_final_state, state_dtype):
    NC, H, _, K = w.shape
    V = u.shape[-1]
    h = w.new_empty(NC, H, K, V, dtype=state_dtype)
    v_new = torch.empty_like(u)
    ht = w.new_empty(tab.N, H, K, V, dtype=torch.float32) if output_final_state else None
    return h, v_new, ht


def walk_fwd_h(w, u, kd, gamma, h0, tab: ChunkTable, output_final_state: bool, state_dtype, prec: str):
    """chunk_h.chunk_dp_fwd_h's signature and results, on walk_fwd_h_split.
    w, kd [NC,H,BL,K]; u [NC,H,BL,V]; gamma [NC,H]; h0 [N,H,K,V] or None.
    Returns h [NC,H,K,V] (state_dtype), v_new [NC,H,BL,V] (u's dtype), ht [N,H,K,V] float32 or None."""
    NC, H, _, K = w.shape
    V = u.shape[-1]
    if K > 256:
        raise ValueError(f"walk_fwd_h: K up to 256 (4 tiles of 64), got {K}")
    h, v_new, ht = _outputs(w, u, tab, output_final_state, state_dtype)
    launch(walk_fwd_h_split, _grid(V, H, tab.N), w, u, kd, gamma, h0, h, v_new, ht, tab.seq_chunks,
           H=H, K=K, V=V, BL=BL, KT=k_tile(K), PREC=prec)
    return h, v_new, ht


def walk_fwd_h_pf(w, u, kd, gamma, h0, tab: ChunkTable, output_final_state: bool, state_dtype, prec: str):
    """As walk_fwd_h, on walk_fwd_h_split_pf (the next chunk's W / U / Kd tiles prefetched into registers)."""
    NC, H, _, K = w.shape
    V = u.shape[-1]
    if K > 256:
        raise ValueError(f"walk_fwd_h_pf: K up to 256 (4 tiles of 64), got {K}")
    h, v_new, ht = _outputs(w, u, tab, output_final_state, state_dtype)
    if NC:
        launch(walk_fwd_h_split_pf, _grid(V, H, tab.N), w, u, kd, gamma, h0, h, v_new, ht, tab.seq_chunks,
               H=H, K=K, V=V, BL=BL, KT=k_tile(K), PREC=prec)
    return h, v_new, ht


def walk_fwd_h_k(w, u, k, G, gamma, h0, tab: ChunkTable, output_final_state: bool, state_dtype, prec: str):
    """As walk_fwd_h, with Kd formed in the walk from k [NTOK*n,H,K] (interleaved steps, chunk_dp_fwd_wu's input)
    and G [NC,H,BL] (chunk_dp_fwd_inv's gate cumsum; None when not gated: Kd = k)."""
    NC, H, _, K = w.shape
    V = u.shape[-1]
    if K > 256:
        raise ValueError(f"walk_fwd_h_k: K up to 256 (4 tiles of 64), got {K}")
    h, v_new, ht = _outputs(w, u, tab, output_final_state, state_dtype)
    launch(walk_fwd_h_split_k, _grid(V, H, tab.N), w, u, k, G, gamma, h0, h, v_new, ht, tab.seq_chunks,
           tab.chunk_bos, tab.chunk_len, H=H, K=K, V=V, BL=BL, KT=k_tile(K), NH=tab.n, BT=tab.BT, PREC=prec)
    return h, v_new, ht


class pinned:
    """with pinned(kernel, config): the kernel's autotuner tries only `config` (restored on exit)."""

    def __init__(self, kernel, config):
        self.at, self.config = autotuner(kernel), config

    def __enter__(self):
        self.saved = self.at.configs
        self.at.configs = [self.config]
        return self

    def __exit__(self, *exc):
        self.at.configs = self.saved


def label(cfg) -> str:
    return " ".join([f"{k}={v}" for k, v in cfg.kwargs.items()] + [f"w={cfg.num_warps}", f"s={cfg.num_stages}"])


# -- GPU check and timing --------------------------------------------------------------------------------------------

B, T, H, D = 4, 4096, 16, 128


def make_inputs(n: int, gated: bool, dev, dtype=torch.bfloat16, seed: int = 0):
    """Flattened layer-like inputs (L2-normalised keys, sigmoid betas, log-sigmoid gates) and dpx's own
    preparation: chunk_table -> chunk_dp_fwd_inv -> chunk_dp_fwd_wu, and kd as dpx's walks form it (kd_tensor).
    Returns (tab, k, w, u, kd, G, gamma, h0)."""
    from dpx.kernels.delta_product.index import chunk_table
    from dpx.kernels.delta_product.wy_fast import chunk_dp_fwd_inv, chunk_dp_fwd_wu
    from dpx.kernels.utils import dot_precision
    gen = torch.Generator(device=dev).manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, device=dev, generator=gen)
    k = torch.nn.functional.normalize(rnd(B * T * n, H, D), dim=-1).to(dtype)
    v = rnd(B * T * n, H, D).to(dtype)
    beta = torch.sigmoid(rnd(B * T * n, H)).to(dtype)
    g = torch.nn.functional.logsigmoid(rnd(B * T, H) + 3.0) if gated else None
    tab = chunk_table(B, T, n, dev)
    t, G, gamma = chunk_dp_fwd_inv(k, beta, g, tab)
    w, u = chunk_dp_fwd_wu(k, v, beta, G, t, tab, dot_precision(dtype))
    kd = kd_tensor(k, G, tab, gated)
    h0 = 0.1 * rnd(B, H, D, D)
    return tab, k, w, u, kd, G, gamma, h0


def _err(ref, out) -> dict:
    ref, out = ref.double(), out.double()
    d = (out - ref).abs()
    scale = ref.abs().max().clamp_min(1e-30)
    return {"max_abs": d.max().item(), "max_rel": (d.max() / scale).item(),
            "rms_rel": (d.norm() / ref.norm().clamp_min(1e-30)).item(), "bitwise": bool(torch.equal(ref, out))}


def _reset(*kernels):
    for kern in kernels:
        at = autotuner(kern)
        at.cache = {}


def _fast_autotune(*kernels):
    """Both autotuners time their configs the same (shorter) way, so that 24 + 8 configs per shape fit the budget."""
    fast = lambda fn, quantiles: triton.testing.do_bench(fn, warmup=5, rep=20, quantiles=quantiles)
    for kern in kernels:
        at = autotuner(kern)
        if hasattr(at, "_do_bench"):  # Triton >= 3.3: do_bench is a property over _do_bench
            at._do_bench = fast
        else:
            at.do_bench = fast


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--ns", default="1,2,3")
    ap.add_argument("--gated", default="0,1")
    ap.add_argument("--budget-s", type=float, default=55.0, help="stop starting new timings after this")
    ap.add_argument("--resources", action="store_true", help="CPU: compile for sm_90 and print regs/spills")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    if a.resources:
        return resources(a.out)
    if not torch.cuda.is_available():
        sys.exit("walk_proto: needs a CUDA device (or --resources on the CPU)")
    t0 = time.time()
    from dpx.kernels.delta_product import wy_fast
    # the preparation kernels are not under study: one config each, so their autotuning costs no budget
    for kern in (wy_fast.chunk_dp_fwd_kernel_inv, wy_fast.chunk_dp_fwd_kernel_wu):
        at = autotuner(kern)
        at.configs = at.configs[:1] if len(at.configs) == 1 else [c for c in at.configs if c.num_warps == 4][:1]
    _fast_autotune(chunk_dp_fwd_kernel_h, walk_fwd_h_split, walk_fwd_h_split_k, walk_fwd_h_split_pf)
    dev = torch.device("cuda")
    bench = lambda fn: triton.testing.do_bench(fn, warmup=5, rep=25, return_mode="median")
    out = {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "torch": torch.__version__,
           "shape": {"B": B, "T": T, "H": H, "K": D, "V": D, "dtype": "bf16"}, "cases": []}
    dpx_cfgs = list(autotuner(chunk_dp_fwd_kernel_h).configs)
    ok_all = True
    cases = [(n, bool(int(gd))) for gd in a.gated.split(",") for n in map(int, a.ns.split(","))]
    # the headline case first (n_h = 2, not gated), so a short budget still measures it
    cases.sort(key=lambda c: (c != (2, False), c[1], c[0]))
    for n, gated in cases:
        tab, k, w, u, kd, G, gamma, h0 = make_inputs(n, gated, dev)
        args = (w, u, kd, gamma, h0, tab, True, torch.bfloat16, "tf32")
        argd = (w, u, k, G, gamma, h0, tab, True, torch.bfloat16, "tf32", gated)  # dpx's walk forms Kd from k, G
        argk = (w, u, k, G if gated else None, gamma, h0, tab, True, torch.bfloat16, "tf32")
        case = {"n_h": n, "gated": gated, "chunks_per_seq": tab.NC // B, "NC": tab.NC}
        _reset(chunk_dp_fwd_kernel_h, walk_fwd_h_split, walk_fwd_h_split_k, walk_fwd_h_split_pf)
        ref = chunk_dp_fwd_h(*argd)
        got = walk_fwd_h(*args)
        # the k variant runs at the split walk's pick for this case (autotuning its own 24 configs per gate flag
        # would double the compile time of this script)
        k_pin = pinned(walk_fwd_h_split_k, autotuner(walk_fwd_h_split).best_config)
        with k_pin:
            gotk = walk_fwd_h_k(*argk)
        gotp = walk_fwd_h_pf(*args)
        torch.cuda.synchronize()
        case["pf_vs_split"] = {nm: _err(r, x) for nm, r, x in zip(("h", "v_new", "ht"), got, gotp)}
        case["pf_err_vs_dpx"] = {nm: _err(r, x) for nm, r, x in zip(("h", "v_new", "ht"), ref, gotp)}
        case["err_vs_dpx"] = {nm: _err(r, x) for nm, r, x in zip(("h", "v_new", "ht"), ref, got)}
        case["k_variant_vs_split"] = {nm: _err(r, x) for nm, r, x in zip(("h", "v_new", "ht"), got, gotk)}
        case["kd_equals_formed"] = _kd_check(k, kd, G if gated else None, tab)
        ok = all(e["max_rel"] < 2e-2 and e["rms_rel"] < 1e-2
                 for e in [*case["err_vs_dpx"].values(), *case["pf_err_vs_dpx"].values()])
        ok_all &= ok
        case["ok"] = ok
        case["dpx_best"] = label(autotuner(chunk_dp_fwd_kernel_h).best_config)
        case["split_best"] = label(autotuner(walk_fwd_h_split).best_config)
        case["split_k_best"] = label(autotuner(walk_fwd_h_split_k).best_config)
        case["pf_best"] = label(autotuner(walk_fwd_h_split_pf).best_config)
        case["dpx_ms"] = bench(lambda: chunk_dp_fwd_h(*argd))
        case["split_ms"] = bench(lambda: walk_fwd_h(*args))
        with k_pin:
            case["split_k_ms"] = bench(lambda: walk_fwd_h_k(*argk))
        case["pf_ms"] = bench(lambda: walk_fwd_h_pf(*args))
        steps = tab.NC // B
        case["us_per_step"] = {key: case[key + "_ms"] * 1e3 / steps for key in ("dpx", "split", "split_k", "pf")}
        print(f"[{time.time() - t0:5.1f}s] n_h={n} gated={gated}: dpx {case['dpx_ms']:.4f} ms ({case['dpx_best']}), "
              f"split {case['split_ms']:.4f} ms ({case['split_best']}), split_k {case['split_k_ms']:.4f} ms "
              f"({case['split_k_best']}), pf {case['pf_ms']:.4f} ms ({case['pf_best']}); max rel err h {case['err_vs_dpx']['h']['max_rel']:.2e} v_new "
              f"{case['err_vs_dpx']['v_new']['max_rel']:.2e} ht {case['err_vs_dpx']['ht']['max_rel']:.2e}; "
              f"split_k bitwise {all(e['bitwise'] for e in case['k_variant_vs_split'].values())}", flush=True)
        case["split_pinned"], case["dpx_pinned"] = {}, {}
        for cfg in CONFIGS:
            if time.time() - t0 > a.budget_s:
                case["truncated"] = True
                break
            with pinned(walk_fwd_h_split, cfg):
                try:
                    walk_fwd_h(*args)
                    case["split_pinned"][label(cfg)] = bench(lambda: walk_fwd_h(*args))
                except Exception as e:  # noqa: BLE001 - out of resources is a finding
                    case["split_pinned"][label(cfg)] = f"{type(e).__name__}: {str(e)[:100]}"
        for cfg in dpx_cfgs:
            if time.time() - t0 > a.budget_s:
                case["truncated"] = True
                break
            with pinned(chunk_dp_fwd_kernel_h, cfg):
                case["dpx_pinned"][label(cfg)] = bench(lambda: chunk_dp_fwd_h(*argd))
        out["cases"].append(case)
        _write(a.out, out)
        del tab, k, w, u, kd, G, gamma, h0, ref, got, gotk, gotp
    out["elapsed_s"] = time.time() - t0
    out["ok"] = ok_all
    _write(a.out, out)
    print(open(os.path.join(a.out, "walk_proto.md")).read())
    return 0 if ok_all else 1


def _kd_check(k, kd, G, tab) -> dict:
    """dpx's stored kd against k gathered in torch (0 on padding rows), times torch.exp(G_last - G) when gated.
    Not gated: bitwise equal expected. Gated: torch's exp is not Triton's (ex2.approx on the GPU), so a few bf16
    ulps can differ here; the exact test of Kd-in-the-walk is split_k against split, which share Triton's exp."""
    from dpx.kernels.delta_product.index import gather_indices
    _, step, _ = gather_indices(tab)  # [NC, BL], padding -> NTOK*n
    kp = torch.cat([k, k.new_zeros(1, *k.shape[1:])])[step]  # [NC, BL, H, K]
    kp = kp.permute(0, 2, 1, 3)  # [NC, H, BL, K]
    if G is not None:
        kp = (kp.float() * torch.exp(G[..., -1:] - G)[..., None]).to(k.dtype)
    return {"bitwise": bool(torch.equal(kp, kd)), "max_abs": (kp.float() - kd.float()).abs().max().item()}


def _write(dirname, out):
    with open(os.path.join(dirname, "walk_proto.json"), "w") as f:
        json.dump(out, f, indent=1)
    L = [f"walk prototype on {out['device']} (Triton {out['triton']}), B={B} T={T} H={H} K=V={D} bf16; "
         "median ms (triton.testing.do_bench), each autotuned at its shape; us/step = ms / chunks per sequence.", "",
         "| n_h | gated | chunks/seq | dpx fwd_h ms (cfg) | split ms (cfg) | split_k ms | split_pf ms (cfg) "
         "| us/step dpx / split / split_k / pf | speedup split, pf | max rel err h / v_new / ht (split; pf) "
         "| split_k bitwise | kd vs torch k*exp: bitwise (max abs) |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in out["cases"]:
        e, ep = c["err_vs_dpx"], c["pf_err_vs_dpx"]
        u = c["us_per_step"]
        L.append(f"| {c['n_h']} | {c['gated']} | {c['chunks_per_seq']} | {c['dpx_ms']:.4f} ({c['dpx_best']}) | "
                 f"{c['split_ms']:.4f} ({c['split_best']}) | {c['split_k_ms']:.4f} | {c['pf_ms']:.4f} ({c['pf_best']}) | "
                 f"{u['dpx']:.2f} / {u['split']:.2f} / {u['split_k']:.2f} / {u['pf']:.2f} | "
                 f"{c['dpx_ms'] / c['split_ms']:.2f}x, {c['dpx_ms'] / c['pf_ms']:.2f}x | {e['h']['max_rel']:.1e} / "
                 f"{e['v_new']['max_rel']:.1e} / {e['ht']['max_rel']:.1e}; {ep['h']['max_rel']:.1e} / "
                 f"{ep['v_new']['max_rel']:.1e} / {ep['ht']['max_rel']:.1e} | "
                 f"{all(x['bitwise'] for x in c['k_variant_vs_split'].values())} | {c['kd_equals_formed']['bitwise']} "
                 f"({c['kd_equals_formed']['max_abs']:.1e}) |")
    L += ["", "Every config pinned alone (ms):", ""]
    cfgs = [label(c) for c in CONFIGS]
    L.append("| config | " + " | ".join(f"n_h={c['n_h']}{' g' if c['gated'] else ''}" for c in out["cases"]) + " |")
    L.append("|---|" + "---|" * len(out["cases"]))
    fmt = lambda x: "–" if x is None else (f"{x:.4f}" if isinstance(x, float) else str(x)[:40])
    for cl in cfgs:
        L.append(f"| split {cl} | " + " | ".join(fmt(c["split_pinned"].get(cl)) for c in out["cases"]) + " |")
    dcf = sorted({cl for c in out["cases"] for cl in c["dpx_pinned"]})
    for cl in dcf:
        L.append(f"| dpx {cl} | " + " | ".join(fmt(c["dpx_pinned"].get(cl)) for c in out["cases"]) + " |")
    with open(os.path.join(dirname, "walk_proto.md"), "w") as f:
        f.write("\n".join(L) + "\n")


# -- sm_90 resources, on the CPU (benchmarks/kernel_resources.py's AOT compile) -----------------------------------

def resources(dirname) -> int:
    if INTERPRET:
        sys.exit("walk_proto --resources: unset TRITON_INTERPRET")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import kernel_resources as kr
    from dpx.kernels.delta_product.index import chunk_table
    from triton.runtime.jit import JITFunction
    bf = torch.bfloat16
    NC, Hh, N = 4, 2, 1
    tab = chunk_table(1, 64, 2, "cpu")
    w = torch.zeros(NC, Hh, BL, D, dtype=bf)
    u = torch.zeros(NC, Hh, BL, D, dtype=bf)
    gamma = torch.zeros(NC, Hh)
    h0 = torch.zeros(N, Hh, D, D)
    h = torch.zeros(NC, Hh, D, D, dtype=bf)
    ht = torch.zeros(N, Hh, D, D)
    k = torch.zeros(64 * 2, Hh, D, dtype=bf)
    G = torch.zeros(NC, Hh, BL)
    common = dict(h0=h0, h=h, v_new=u, ht=ht, seq_chunks=tab.seq_chunks, H=Hh, K=D, V=D, BL=BL, PREC="tf32",
                  USE_INITIAL_STATE=True, STORE_FINAL_STATE=True)
    jobs = [("chunk_dp_fwd_kernel_h", chunk_dp_fwd_kernel_h,
             dict(common, w=w, u=u, k=k, G=G, gamma=gamma, chunk_bos=tab.chunk_bos, chunk_len=tab.chunk_len, NH=2, BTC=32,
                  BK=D, USE_G=False),
             list(autotune_configs([triton.Config({"BV": bv}, num_warps=nw, num_stages=s) for bv in (32, 64)
                                    for nw in (2, 4, 8) for s in (1, 2, 3, 4)])))]
    jobs.append(("walk_fwd_h_split", walk_fwd_h_split, dict(common, w=w, u=u, kd=w, gamma=gamma, KT=64), CONFIGS))
    jobs.append(("walk_fwd_h_split_pf", walk_fwd_h_split_pf, dict(common, w=w, u=u, kd=w, gamma=gamma, KT=64),
                 PF_CONFIGS))
    for use_g in (False, True):
        jobs.append((f"walk_fwd_h_split_k{' (gated)' if use_g else ''}", walk_fwd_h_split_k,
                     dict(common, w=w, u=u, k=k, G=G if use_g else None, gamma=gamma, chunk_bos=tab.chunk_bos,
                          chunk_len=tab.chunk_len, KT=64, NH=2, BT=32, USE_G=use_g), CONFIGS))
    rows = {}
    for name, kern, values, cfgs in jobs:
        jf = kern
        while not isinstance(jf, JITFunction):
            jf = jf.fn
        for cfg in cfgs:
            try:
                r = kr.compile_one(jf, values, cfg, 90)
                txt = f"{r['regs']} regs, spill {r['spill_st']}/{r['spill_ld']} B, shared {r['shared']:,} B"
            except Exception as e:  # noqa: BLE001
                r, txt = {"error": str(e).splitlines()[0][:100]}, "error: " + str(e).splitlines()[0][:100]
            rows.setdefault(label(cfg), {})[name] = r
            print(f"{name} {label(cfg)}: {txt}", flush=True)
    names = [j[0] for j in jobs]
    L = [f"sm_90 AOT compile (Triton {triton.__version__}, ptxas -v), K=V=128 bf16, h0 and final state: "
         "registers / spill stores+loads (B) / shared (B).", "",
         "| config | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for cl, per in rows.items():
        cell = lambda r: "–" if r is None else ("err" if "error" in r else
                                               f"{r['regs']} / {r['spill_st']}+{r['spill_ld']} / {r['shared']:,}")
        L.append(f"| {cl} | " + " | ".join(cell(per.get(nm)) for nm in names) + " |")
    table = "\n".join(L)
    print(table)
    with open(os.path.join(dirname, "walk_proto_resources.md"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(dirname, "walk_proto_resources.json"), "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
