"""L2 norm over groups of D channels (optionally after SiLU), Triton forward and backward.

    y[..., group] = a / sqrt(sum_group a^2 + eps),   a = silu(x) (activation=True) or x

For the delta layers without a short convolution (q, k = l2norm(silu(proj))); with one, the norm is fused into
kernels/fused/short_conv.py instead. x [M, C] (or [B, T, C]) may be a column slice of a wider tensor (any row
stride, channels contiguous); the output is contiguous, in x's dtype, computed in float32. The backward
recomputes a from x (nothing but x is saved). `naive_l2norm` is the plain PyTorch form.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ..utils import fused_impl


def naive_l2norm(x, group: int, activation: bool = False, eps: float = 1e-6):
    dt = x.dtype
    cd = torch.float32 if dt in (torch.float16, torch.bfloat16) else dt
    a = x.to(cd)
    if activation:
        a = F.silu(a)
    a = a.unflatten(-1, (-1, group))
    return (a / torch.sqrt((a * a).sum(-1, keepdim=True) + eps)).flatten(-2).to(dt)


def l2norm(x, group: int, activation: bool = False, eps: float = 1e-6, impl: str = "auto"):
    impl = fused_impl(impl, x)
    if x.shape[-1] % group:
        raise ValueError(f"l2norm: group={group} does not divide the {x.shape[-1]} channels")
    if impl == "torch":
        return naive_l2norm(x, group, activation, eps)
    return L2NormFn.apply(x, group, activation, eps)


BM = 32  # rows per program


def _rows(x):
    """x [..., C], channels contiguous -> ([M, C] with its row stride: a view where the strides allow, e.g. a
    column slice of [B, T, C'], else a copy), leading shape."""
    return x.reshape(-1, x.shape[-1]), x.shape[:-1]


class L2NormFn(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x, group, activation, eps):
        if x.stride(-1) != 1:
            x = x.contiguous()
        x2, lead = _rows(x)
        M, C = x2.shape
        y = torch.empty(M, C, device=x.device, dtype=x.dtype)
        _l2_fwd_kernel[(triton.cdiv(M, BM), C // group)](x2, y, M, C, x2.stride(0), eps, D=group,
                                                           BD=triton.next_power_of_2(group), BM=BM,
                                                           ACT=bool(activation))
        ctx.save_for_backward(x2)
        ctx.cfg = (group, activation, eps, lead)
        return y.view(*lead, C)

    @staticmethod
    def backward(ctx, dy):
        (x2,) = ctx.saved_tensors
        group, activation, eps, lead = ctx.cfg
        M, C = x2.shape
        dy = dy.reshape(M, C).contiguous()
        dx = torch.empty(M, C, device=x2.device, dtype=x2.dtype)
        _l2_bwd_kernel[(triton.cdiv(M, BM), C // group)](x2, dy, dx, M, C, x2.stride(0), eps, D=group,
                                                           BD=triton.next_power_of_2(group), BM=BM,
                                                           ACT=bool(activation), num_warps=8)
        return dx.view(*lead, C), None, None, None


@triton.jit
def _l2_fwd_kernel(x, y, M, C, sxm, eps, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, ACT: tl.constexpr):
    i_m, i_g = tl.program_id(0), tl.program_id(1)
    rows = (i_m * BM + tl.arange(0, BM)).to(tl.int64)
    o_d = tl.arange(0, BD)
    cols = i_g * D + o_d
    m = (rows < M)[:, None] & (o_d < D)[None, :]
    a = tl.load(x + rows[:, None] * sxm + cols[None, :], mask=m, other=0.).to(tl.float32)
    if ACT:
        a = a * tl.sigmoid(a)
    a = a * tl.rsqrt(tl.sum(a * a, axis=1) + eps)[:, None]
    tl.store(y + rows[:, None] * C + cols[None, :], a.to(y.dtype.element_ty), mask=m)


@triton.jit
def _l2_bwd_kernel(x, dy, dx, M, C, sxm, eps, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr,
                   ACT: tl.constexpr):
    i_m, i_g = tl.program_id(0), tl.program_id(1)
    rows = (i_m * BM + tl.arange(0, BM)).to(tl.int64)
    o_d = tl.arange(0, BD)
    cols = i_g * D + o_d
    m = (rows < M)[:, None] & (o_d < D)[None, :]
    z = tl.load(x + rows[:, None] * sxm + cols[None, :], mask=m, other=0.).to(tl.float32)
    g = tl.load(dy + rows[:, None] * C + cols[None, :], mask=m, other=0.).to(tl.float32)
    if ACT:
        sg = tl.sigmoid(z)
        a = z * sg
    else:
        a = z
    r = tl.rsqrt(tl.sum(a * a, axis=1) + eps)
    yv = a * r[:, None]
    g = (g - yv * tl.sum(g * yv, axis=1)[:, None]) * r[:, None]
    if ACT:
        g = g * sg * (1 + z * (1 - sg))
    tl.store(dx + rows[:, None] * C + cols[None, :], g.to(dx.dtype.element_ty), mask=m)
