"""Mamba-2 / SSD: a data-dependent scalar decay per head (dpx.kernels.gated_linear_recurrence)."""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..layers import RMSNorm, ShortConv
from .base import Mixer


class Mamba2(Mixer):
    """Mamba-2 / SSD (Dao & Gu 2024), one group: in_proj -> (z, xBC, dt); causal conv + SiLU on xBC;
    h_t = exp(dt_t A_h) h + (dt_t x_t) B_t^T per head; y = C_t h_t + D x_t; RMSNorm(y * SiLU(z)) (mamba_ssm's
    RMSNormGated with norm_before_gate=False, as fla's Mamba2); out_proj.
    Heads: num_heads, each of size expand * hidden_size / num_heads; state size N = state_size."""

    def __init__(self, cfg):
        super().__init__(cfg)
        d, H, N = cfg.hidden_size, cfg.num_heads, cfg.state_size
        self.Di = cfg.expand * d
        if self.Di % H:
            raise ValueError(f"num_heads: {H} does not divide mamba2's inner size expand*hidden_size = {self.Di}")
        self.H, self.P, self.N = H, self.Di // H, N
        self.in_proj = nn.Linear(d, 2 * self.Di + 2 * N + H, bias=False)
        self.conv = ShortConv(self.Di + 2 * N, cfg.conv_size, bias=True)
        self.A_log = nn.Parameter(torch.log(torch.empty(H).uniform_(1, 16)))
        dt = torch.exp(torch.rand(H) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3)).clamp(min=1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.D = nn.Parameter(torch.ones(H))
        for p in (self.A_log, self.dt_bias, self.D):
            p._no_weight_decay = True
        self.norm = RMSNorm(self.Di, eps=cfg.norm_eps)
        self.out_proj = nn.Linear(self.Di, d, bias=False)

    def _forward(self, x, state, mode):
        B, T, _ = x.shape
        H, P, N, Di = self.H, self.P, self.N, self.Di
        z, xBC, dt = self.in_proj(x).split([Di, Di + 2 * N, H], dim=-1)
        xBC, conv = self.conv(xBC, state.get("conv"))
        xs, Bm, Cm = xBC.split([Di, N, N], dim=-1)
        dt = F.softplus(dt + self.dt_bias)                                   # [B, T, H]
        w = (dt * -self.A_log.exp())[..., None]                              # scalar log decay per head
        xs = xs.reshape(B, T, H, P)
        k = Bm[:, :, None].expand(B, T, H, N)
        q = Cm[:, :, None].expand(B, T, H, N)
        o, S = self.recurrence(mode, q, k, xs * dt[..., None], w, state.get("S"))
        y = o + self.D[:, None] * xs
        self._keep(q=Cm, k=Bm, v=xs, g=w[..., 0])
        y = self.norm(y.reshape(B, T, Di) * F.silu(z))  # gate, then normalise (not RMSNorm(y) * SiLU(z))
        return self.out_proj(y), {"S": S, "conv": conv}
