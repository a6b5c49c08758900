"""RMSNorm over each head's D channels, times an optional SiLU gate, Triton forward and backward.

    y = x / sqrt(mean(x^2) + eps) * weight [* silu(gate)]          (fla's FusedRMSNormGated / RMSNorm)

x [..., H, D] (the mixer output, contiguous), gate [..., H*D] or [..., H, D] or None: the gate may be a column slice
of a wider tensor (one fused input projection; any row stride, channels contiguous). One pass forward (float32
inside, one cast at the store, 1/rms saved per row), one pass backward; the weight gradient is a per-program
partial sum in float32 reduced by one torch sum. `naive_rms_norm_gated` is the plain PyTorch form, as
models/layers.py:GatedRMSNorm computes it (norm in float32, cast, then the gate in the input dtype).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ..utils import fused_impl


def naive_rms_norm_gated(x, weight, gate=None, eps: float = 1e-6):
    dt = x.dtype
    xf = x.float() if dt in (torch.float16, torch.bfloat16) else x
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.to(xf.dtype)).to(dt)
    if gate is None:
        return y
    return y * F.silu(gate.reshape(x.shape).to(dt))


def rms_norm_gated(x, weight, gate=None, eps: float = 1e-6, impl: str = "auto"):
    impl = fused_impl(impl, x)
    if impl == "torch":
        return naive_rms_norm_gated(x, weight, gate, eps)
    return RMSNormGatedFn.apply(x, weight, gate, eps)


MAX_PROGRAMS_BWD = 1024  # the backward loops over row blocks, so the weight-gradient partials stay small


def _br(D: int) -> int:
    """Rows per program: a [BR, next_pow2(D)] float32 tile of about 4K elements (32 rows at head dim 128)."""
    return max(1, min(32, 4096 // triton.next_power_of_2(D)))


def _gate_rows(gate, x):
    """gate -> (tensor, token row stride, heads per token) so that row r = token r // H, head r % H."""
    H, D = x.shape[-2], x.shape[-1]
    g = gate.reshape(*x.shape[:-2], H * D) if gate.shape[-1] != H * D else gate
    g = g.reshape(-1, H * D)
    if g.stride(-1) != 1:
        g = g.contiguous()
    return g, g.stride(0), H


class RMSNormGatedFn(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x, weight, gate, eps):
        shape = x.shape
        D = shape[-1]
        x2 = x.reshape(-1, D).contiguous()
        N = x2.shape[0]
        H = shape[-2] if x.dim() >= 2 else 1
        if gate is not None:
            g2, sgt, H = _gate_rows(gate, x)
        else:
            g2, sgt = x2, 0
        y = torch.empty_like(x2)
        rstd = torch.empty(N, device=x.device, dtype=torch.float32)
        BR = _br(D)
        _rms_fwd_kernel[(triton.cdiv(N, BR),)](x2, weight, g2, y, rstd, N, H, sgt, eps, D=D,
                                               BD=triton.next_power_of_2(D), BR=BR, HAS_GATE=gate is not None,
                                               num_warps=8 if gate is not None else 4)  # gated, 4 warps: 252 regs
        ctx.save_for_backward(x2, weight, g2 if gate is not None else None, rstd)
        ctx.cfg = (shape, H, sgt, gate.shape if gate is not None else None, gate.dtype if gate is not None else None)
        return y.view(shape)

    @staticmethod
    def backward(ctx, dy):
        x2, weight, g2, rstd = ctx.saved_tensors
        shape, H, sgt, gshape, gdtype = ctx.cfg
        N, D = x2.shape
        dy = dy.reshape(N, D).contiguous()
        BR = _br(D)
        NB = triton.cdiv(N, BR)
        NP = min(NB, MAX_PROGRAMS_BWD)
        dx = torch.empty_like(x2)
        dw = torch.empty(NP, D, device=x2.device, dtype=torch.float32)
        dg = torch.empty(N, D, device=x2.device, dtype=gdtype) if g2 is not None else dx
        _rms_bwd_kernel[(NP,)](x2, weight, g2 if g2 is not None else x2, dy, rstd, dx, dw, dg, N, NP, triton.cdiv(NB, NP), H,
                               sgt, D=D,
                               BD=triton.next_power_of_2(D), BR=BR, HAS_GATE=g2 is not None,
                               num_warps=8)  # 4 warps: 200-255 registers at head dim 128 (sm_90 compile)
        dgate = dg.view(gshape) if g2 is not None else None
        return dx.view(shape), dw.sum(0).to(weight.dtype), dgate, None


@triton.jit
def _rms_fwd_kernel(x, w, g, y, rstd, N, H, sgt, eps, D: tl.constexpr, BD: tl.constexpr, BR: tl.constexpr,
                    HAS_GATE: tl.constexpr):
    rows = (tl.program_id(0) * BR + tl.arange(0, BR)).to(tl.int64)
    cols = tl.arange(0, BD)
    cm = cols < D
    m = (rows < N)[:, None] & cm[None, :]
    xv = tl.load(x + rows[:, None] * D + cols[None, :], mask=m, other=0.).to(tl.float32)
    r = tl.rsqrt(tl.sum(xv * xv, axis=1) / D + eps)
    wv = tl.load(w + cols, mask=cm, other=0.).to(tl.float32)
    yv = xv * r[:, None] * wv[None, :]
    if HAS_GATE:
        gp = g + (rows // H)[:, None] * sgt + (rows % H)[:, None] * D + cols[None, :]
        gv = tl.load(gp, mask=m, other=0.).to(tl.float32)
        yv = yv * gv * tl.sigmoid(gv)
    tl.store(y + rows[:, None] * D + cols[None, :], yv.to(y.dtype.element_ty), mask=m)
    tl.store(rstd + rows, r, mask=rows < N)


@triton.jit
def _rms_bwd_kernel(x, w, g, dy, rstd, dx, dw, dg, N, NP, NITER, H, sgt, D: tl.constexpr, BD: tl.constexpr,
                    BR: tl.constexpr, HAS_GATE: tl.constexpr):
    """NP programs loop over row blocks pid, pid + NP, ...; each writes one float32 partial of the weight gradient."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BD)
    cm = cols < D
    wv = tl.load(w + cols, mask=cm, other=0.).to(tl.float32)
    dw_acc = tl.zeros([BD], dtype=tl.float32)
    for i in range(0, NITER):  # row blocks pid, pid + NP, ... (past the end: masked)
        rows = ((pid + i * NP) * BR + tl.arange(0, BR)).to(tl.int64)
        m = (rows < N)[:, None] & cm[None, :]
        xv = tl.load(x + rows[:, None] * D + cols[None, :], mask=m, other=0.).to(tl.float32)
        dyv = tl.load(dy + rows[:, None] * D + cols[None, :], mask=m, other=0.).to(tl.float32)
        r = tl.load(rstd + rows, mask=rows < N, other=0.)
        xh = xv * r[:, None]
        if HAS_GATE:
            gp = g + (rows // H)[:, None] * sgt + (rows % H)[:, None] * D + cols[None, :]
            gv = tl.load(gp, mask=m, other=0.).to(tl.float32)
            sg = tl.sigmoid(gv)
            dgv = dyv * xh * wv[None, :] * sg * (1 + gv * (1 - sg))
            tl.store(dg + rows[:, None] * D + cols[None, :], dgv.to(dg.dtype.element_ty), mask=m)
            dyv = dyv * gv * sg
        dw_acc += tl.sum(dyv * xh, axis=0)
        dxh = dyv * wv[None, :]
        dxv = (dxh - xh * (tl.sum(dxh * xh, axis=1) / D)[:, None]) * r[:, None]
        tl.store(dx + rows[:, None] * D + cols[None, :], dxv.to(dx.dtype.element_ty), mask=m)
    tl.store(dw + pid * D + cols, dw_acc, mask=cm)
