"""Causal depthwise short convolution (+ SiLU, + optional L2 norm per group), Triton forward and backward.

    y[b, t, c] = act(bias[c] + sum_j weight[c, j] * xx[b, t + j, c]),   xx = cat(cache, x) over time   (W taps)
    y[b, t, group] <- y / sqrt(sum_group y^2 + eps)      when l2_group = D (the group is D consecutive channels)

`cache` [B, W-1, C] holds the last W-1 inputs before x (None: zeros); the op also returns the new cache (the last
W-1 inputs of cat(cache, x)), so a decoder can continue one token at a time: that is the decoding state, the same
layout as models/layers.py:ShortConv. x may be a column slice of a wider tensor (any row stride, channels
contiguous), e.g. the q columns of one fused input projection. The output is contiguous [B, T, C].

The L2 norm is the delta-rule kernels' `use_qk_l2norm_in_kernel` moved here: one pass instead of conv, SiLU and a
norm each over memory. It is computed in float32 before the single cast to x's dtype.

Backward (one kernel, fla's design: no intermediate in memory): each program recomputes the pre-activation at the
W shifted row windows it needs (dx[t] = sum_j w[j] dz[t + W-1-j]) from x, so it reads x W^2 times from cache and
writes dx once; weight/bias gradients are per-program partial sums in float32, reduced by one torch sum. The cache
gets no gradient (decoding runs without autograd); `causal_conv1d` refuses a cache that requires grad.

`naive_causal_conv1d` is the plain PyTorch form (the reference, and the path on CPU).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ..utils import fused_impl


def naive_causal_conv1d(x, weight, bias=None, cache=None, activation: bool = True, l2_group: int | None = None,
                        eps: float = 1e-6):
    """Plain PyTorch: x [B, T, C], weight [C, W] -> (y [B, T, C], new cache [B, W-1, C]). Computed in x's dtype
    (float32 for 16-bit x, cast back), as models/layers.py:ShortConv followed by kernels' l2norm."""
    B, T, C = x.shape
    W = weight.shape[1]
    dt = x.dtype
    cd = torch.float32 if dt in (torch.float16, torch.bfloat16) else dt
    if cache is None:
        cache = x.new_zeros(B, W - 1, C)
    xx = torch.cat([cache.to(dt), x], dim=1)
    xc, w = xx.to(cd), weight.to(cd)
    y = sum(xc[:, j:j + T] * w[:, j] for j in range(W))
    if bias is not None:
        y = y + bias.to(cd)
    if activation:
        y = F.silu(y)
    if l2_group:
        yg = y.view(B, T, C // l2_group, l2_group)
        y = (yg / torch.sqrt((yg * yg).sum(-1, keepdim=True) + eps)).view(B, T, C)
    return y.to(dt), xx[:, xx.shape[1] - (W - 1):]


def causal_conv1d(x, weight, bias=None, cache=None, activation: bool = True, l2_group: int | None = None,
                  eps: float = 1e-6, impl: str = "auto"):
    """Fused form of `naive_causal_conv1d` (same contract). impl: "triton", "torch" or "auto" (Triton on CUDA)."""
    impl = fused_impl(impl, x)
    W = weight.shape[1]
    if l2_group and x.shape[-1] % l2_group:
        raise ValueError(f"causal_conv1d: l2_group={l2_group} does not divide the {x.shape[-1]} channels")
    if impl == "torch":
        return naive_causal_conv1d(x, weight, bias, cache, activation, l2_group, eps)
    if cache is not None and cache.requires_grad and torch.is_grad_enabled():
        raise ValueError("causal_conv1d: the Triton op does not differentiate the cache; use impl='torch'")
    y = CausalConv1dFn.apply(x, weight, bias, cache, activation, l2_group or 0, eps)
    if W == 1:
        new_cache = x.new_zeros(x.shape[0], 0, x.shape[2])
    elif x.shape[1] >= W - 1:
        new_cache = x[:, x.shape[1] - (W - 1):].detach().contiguous()
    else:
        prev = cache.to(x.dtype) if cache is not None else x.new_zeros(x.shape[0], W - 1, x.shape[2])
        new_cache = torch.cat([prev, x.detach()], dim=1)[:, -(W - 1):].contiguous()
    return y, new_cache


def _blocks(C: int, group: int):
    """(channels per program, channel step between programs, number of channel programs)."""
    if group:
        return triton.next_power_of_2(group), group, C // group
    bc = min(64, triton.next_power_of_2(C))
    return bc, bc, triton.cdiv(C, bc)


BT_FWD, NW_FWD = 32, 4  # forward: rows per program, warps
BT_BWD, NW_BWD, NLOOP = 8, 4, 16  # backward: rows per tile, warps, tiles per program (dw partials per program);
# sm_90 (ptxas of Triton 3.6): 208 registers, no spills at head dim 128 (16 rows x 8 warps: 255 + 96 B spilled);
# with the elementwise dw/db partials (Triton 3.7.1's ptxas, fig4's 16-aligned k slice): 168 registers, 4 B
# spilled, 16 barriers and 32 shuffles in the PTX against 30 and 96 with a row sum per tap per tile


class CausalConv1dFn(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x, weight, bias, cache, activation, group, eps):
        B, T, C = x.shape
        W = weight.shape[1]
        if x.stride(2) != 1:
            x = x.contiguous()
        weight = weight.contiguous()
        cache_c = cache.to(x.dtype).contiguous() if cache is not None else None
        y = torch.empty(B, T, C, device=x.device, dtype=x.dtype)
        BC, CSTEP, NC = _blocks(C, group)
        NT = triton.cdiv(T, BT_FWD)
        _conv_fwd_kernel[(NT, NC, B)](
            x, cache_c if cache_c is not None else x, weight, bias if bias is not None else weight, y,
            T, C, x.stride(0), x.stride(1), eps,
            W=W, BT=BT_FWD, BC=BC, CSTEP=CSTEP, ACT=bool(activation), L2=bool(group), HAS_CACHE=cache_c is not None,
            HAS_BIAS=bias is not None, num_warps=NW_FWD)
        ctx.save_for_backward(x, weight, bias, cache_c)
        ctx.cfg = (activation, group, eps)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias, cache = ctx.saved_tensors
        activation, group, eps = ctx.cfg
        B, T, C = x.shape
        W = weight.shape[1]
        dy = dy.contiguous()
        BC, CSTEP, NC = _blocks(C, group)
        nloop = min(NLOOP, triton.cdiv(T, BT_BWD))
        NT = triton.cdiv(T, BT_BWD * nloop)
        dx = torch.empty(B, T, C, device=x.device, dtype=x.dtype)
        dw = torch.empty(B * NT, C, W, device=x.device, dtype=torch.float32)
        db = torch.empty(B * NT, C, device=x.device, dtype=torch.float32) if bias is not None else dw
        _conv_bwd_kernel[(NT, NC, B)](
            x, cache if cache is not None else x, weight, bias if bias is not None else weight, dy, dx, dw, db,
            T, C, x.stride(0), x.stride(1), eps,
            W=W, BT=BT_BWD, BC=BC, CSTEP=CSTEP, ACT=bool(activation), L2=bool(group), HAS_CACHE=cache is not None,
            HAS_BIAS=bias is not None, BW=triton.next_power_of_2(W), NLOOP=nloop, num_warps=NW_BWD)
        dweight = dw.sum(0).to(weight.dtype)
        dbias = db.sum(0).to(bias.dtype) if bias is not None else None
        return dx, dweight, dbias, None, None, None, None


@triton.jit
def _pre(x, cache, w, bias, i_b, rows, cols, cmask, T, C, sxb, sxt,
         W: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, HAS_CACHE: tl.constexpr, HAS_BIAS: tl.constexpr):
    """Pre-activation z [BT, BC] in float32 at output rows `rows` (rows >= T read only masked taps; callers mask
    what they store)."""
    if HAS_BIAS:
        z = tl.zeros([BT, BC], dtype=tl.float32) + tl.load(bias + cols, mask=cmask, other=0.).to(tl.float32)[None, :]
    else:
        z = tl.zeros([BT, BC], dtype=tl.float32)
    for j in tl.static_range(W):
        s = rows + (j - (W - 1))  # position in x of tap j
        m = ((s >= 0) & (s < T))[:, None] & cmask[None, :]
        xv = tl.load(x + i_b * sxb + s[:, None] * sxt + cols[None, :], mask=m, other=0.).to(tl.float32)
        if HAS_CACHE:
            mc = ((s < 0) & (s >= 1 - W))[:, None] & cmask[None, :]
            xv += tl.load(cache + i_b * (W - 1) * C + (s + W - 1)[:, None] * C + cols[None, :], mask=mc,
                          other=0.).to(tl.float32)
        wj = tl.load(w + cols * W + j, mask=cmask, other=0.).to(tl.float32)
        z += xv * wj[None, :]
    return z


@triton.jit
def _conv_fwd_kernel(x, cache, w, bias, y, T, C, sxb, sxt, eps,
                     W: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, CSTEP: tl.constexpr, ACT: tl.constexpr,
                     L2: tl.constexpr, HAS_CACHE: tl.constexpr, HAS_BIAS: tl.constexpr):
    i_t, i_c, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    rows = i_t * BT + tl.arange(0, BT)
    o_c = tl.arange(0, BC)
    cols = i_c * CSTEP + o_c
    cmask = (o_c < CSTEP) & (cols < C)
    z = _pre(x, cache, w, bias, i_b, rows, cols, cmask, T, C, sxb, sxt, W, BT, BC, HAS_CACHE, HAS_BIAS)
    if ACT:
        z = z * tl.sigmoid(z)
    if L2:
        z = z * tl.rsqrt(tl.sum(z * z, axis=1) + eps)[:, None]
    m = (rows < T)[:, None] & cmask[None, :]
    tl.store(y + i_b * T * C + rows[:, None] * C + cols[None, :], z.to(y.dtype.element_ty), mask=m)


@triton.jit
def _dz(x, cache, w, bias, dy, i_b, rows, cols, cmask, T, C, sxb, sxt, eps,
        W: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, ACT: tl.constexpr, L2: tl.constexpr, HAS_CACHE: tl.constexpr, HAS_BIAS: tl.constexpr):
    """Gradient w.r.t. the pre-activation at output rows `rows` (zero for rows >= T), recomputed from x."""
    z = _pre(x, cache, w, bias, i_b, rows, cols, cmask, T, C, sxb, sxt, W, BT, BC, HAS_CACHE, HAS_BIAS)
    m = (rows < T)[:, None] & cmask[None, :]
    g = tl.load(dy + i_b * T * C + rows[:, None] * C + cols[None, :], mask=m, other=0.).to(tl.float32)
    if ACT:
        sg = tl.sigmoid(z)
        a = z * sg
    else:
        a = z
    if L2:
        r = tl.rsqrt(tl.sum(a * a, axis=1) + eps)
        yv = a * r[:, None]
        g = (g - yv * tl.sum(g * yv, axis=1)[:, None]) * r[:, None]
    if ACT:
        g = g * sg * (1 + z * (1 - sg))
    return g


@triton.jit
def _conv_bwd_kernel(x, cache, w, bias, dy, dx, dw, db, T, C, sxb, sxt, eps,
                     W: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, CSTEP: tl.constexpr, ACT: tl.constexpr,
                     L2: tl.constexpr, HAS_CACHE: tl.constexpr, HAS_BIAS: tl.constexpr, BW: tl.constexpr,
                     NLOOP: tl.constexpr):
    """Each program: NLOOP tiles of BT rows (one channel group); dx per tile, dw/db summed over its tiles."""
    i_t, i_c, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    NT = tl.num_programs(0)
    o_c = tl.arange(0, BC)
    o_w = tl.arange(0, BW)
    cols = i_c * CSTEP + o_c
    cmask = (o_c < CSTEP) & (cols < C)
    part = i_b * NT + i_t
    # dw/db partials summed elementwise over the program's tiles and reduced over rows once at the end: a row sum
    # per tap per tile crossed the warps (shared memory and barriers) W + 1 times per 8-row tile
    dw_acc = tl.zeros([BW, BT, BC], dtype=tl.float32)
    db_acc = tl.zeros([BT, BC], dtype=tl.float32)
    for it in range(NLOOP):
        rows = (i_t * NLOOP + it) * BT + tl.arange(0, BT)
        acc = tl.zeros([BT, BC], dtype=tl.float32)
        for j in tl.static_range(W):
            # dx[t] += w[j] * dz[t + W-1-j]
            g = _dz(x, cache, w, bias, dy, i_b, rows + (W - 1 - j), cols, cmask, T, C, sxb, sxt, eps,
                    W, BT, BC, ACT, L2, HAS_CACHE, HAS_BIAS)
            wj = tl.load(w + cols * W + j, mask=cmask, other=0.).to(tl.float32)
            acc += g * wj[None, :]
            if j == W - 1:  # shift 0: this tile's own rows -> weight and bias gradients
                for i in tl.static_range(W):
                    s = rows + (i - (W - 1))
                    m = ((s >= 0) & (s < T))[:, None] & cmask[None, :]
                    xv = tl.load(x + i_b * sxb + s[:, None] * sxt + cols[None, :], mask=m, other=0.).to(tl.float32)
                    if HAS_CACHE:
                        mc = ((s < 0) & (s >= 1 - W))[:, None] & cmask[None, :]
                        xv += tl.load(cache + i_b * (W - 1) * C + (s + W - 1)[:, None] * C + cols[None, :],
                                      mask=mc, other=0.).to(tl.float32)
                    dw_acc += (g * xv)[None, :, :] * (o_w == i).to(tl.float32)[:, None, None]
                db_acc += g
        m = (rows < T)[:, None] & cmask[None, :]
        tl.store(dx + i_b * T * C + rows[:, None] * C + cols[None, :], acc.to(dx.dtype.element_ty), mask=m)
    tl.store(dw + part * C * W + cols[None, :] * W + o_w[:, None], tl.sum(dw_acc, axis=1),
             mask=cmask[None, :] & (o_w < W)[:, None])
    if HAS_BIAS:
        tl.store(db + part * C + cols, tl.sum(db_acc, axis=0), mask=cmask)
