"""Small building blocks shared by the mixers and the LM wrapper: RMSNorm, gated RMSNorm, SwiGLU, short conv."""
from __future__ import annotations

import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..kernels import fused


class RMSNorm(nn.Module):
    """x / rms(x) * weight over the last axis, computed in float32 (or float64) and cast back.

    On CUDA (float32/16-bit x, DPX_FUSED not 0) the block norms run as one Triton op forward and one backward
    (kernels/fused/fused_norm_gate.py: the same arithmetic in float32) instead of ~7 + ~12 elementwise passes.
    `fused`: None (that default), True (force it; the op then runs `fused_impl`), False (the plain form)."""
    fused: bool | None = None
    fused_impl: str = "auto"  # "auto" (Triton on CUDA, the PyTorch form elsewhere), "triton", "torch"

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _use_fused(self, x: torch.Tensor) -> bool:
        if type(self) is not RMSNorm or x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            return False  # GatedRMSNorm keeps its plain form here (the delta mixer fuses its own)
        if self.fused is not None:
            return self.fused
        return x.is_cuda and os.environ.get("DPX_FUSED", "1") != "0"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._use_fused(x):
            return fused.rms_norm_gated(x, self.weight, None, self.eps, impl=self.fused_impl)
        dt = x.dtype
        xf = x.float() if dt in (torch.float16, torch.bfloat16) else x
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.to(xf.dtype)).to(dt)


class GatedRMSNorm(RMSNorm):
    """fla's FusedRMSNormGated: rmsnorm(x) * silu(gate); without a gate, plain RMSNorm."""

    def forward(self, x: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        y = super().forward(x)
        return y if gate is None else y * F.silu(gate)


class SwiGLU(nn.Module):
    """fla's GatedMLP with swish: down(silu(gate(x)) * up(x))."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class ShortConv(nn.Module):
    """Depthwise causal conv over time (+ SiLU), as fla's ShortConvolution. The cache is the last W-1 inputs
    [B, W-1, C], so a one-token step costs O(1)."""

    def __init__(self, channels: int, kernel_size: int, activation: bool = True, bias: bool = False):
        super().__init__()
        self.kernel_size = kernel_size
        self.activation = activation
        self.weight = nn.Parameter(torch.empty(channels, kernel_size))
        self.bias = nn.Parameter(torch.zeros(channels)) if bias else None
        nn.init.uniform_(self.weight, -kernel_size ** -0.5, kernel_size ** -0.5)

    def forward(self, x: torch.Tensor, cache: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, T, C] -> (y [B, T, C], new cache [B, W-1, C])."""
        B, T, C = x.shape
        W = self.kernel_size
        if cache is None:
            cache = x.new_zeros(B, W - 1, C)
        xx = torch.cat([cache.to(x.dtype), x], dim=1)  # [B, W-1+T, C]
        # y_t = sum_j w[:, j] * x_{t - (W-1) + j}; W shifted multiply-adds beat conv1d for W ~ 4 (and stay [B, T, C])
        w = self.weight.to(x.dtype)
        y = sum(xx[:, j:j + T] * w[:, j] for j in range(W))
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        new_cache = xx[:, xx.shape[1] - (W - 1):]
        return (F.silu(y) if self.activation else y), new_cache


def token_shift(x: torch.Tensor, last: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """RWKV's time shift: x_{t-1} for every t (zeros, or `last` [B, D], before the first). Returns (shifted, new last)."""
    prev = x.new_zeros(x.shape[0], 1, x.shape[2]) if last is None else last[:, None].to(x.dtype)
    return torch.cat([prev, x[:, :-1]], dim=1), x[:, -1]


def rotary(x: torch.Tensor, start: int, theta: float = 10000.0) -> torch.Tensor:
    """RoPE (rotate-half convention) on x [B, T, H, D] for positions start .. start+T-1."""
    B, T, H, D = x.shape
    inv = 1.0 / theta ** (torch.arange(0, D, 2, device=x.device, dtype=torch.float64) / D)
    ang = torch.arange(start, start + T, device=x.device, dtype=torch.float64)[:, None] * inv  # [T, D/2]
    cos, sin = ang.cos().to(x.dtype)[None, :, None], ang.sin().to(x.dtype)[None, :, None]
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
