"""Mamba (selective S6, Gu & Dao 2023): in_proj -> (x, z); causal conv + SiLU on x; dt, B, C from x_proj;
per channel c and state n: h_t = exp(dt_t[c] A[c, n]) h + dt_t[c] B_t[n] x_t[c]; y = C_t . h_t + D x; y * SiLU(z).
Run by dpx.kernels.gated_linear_recurrence with one head per channel (K = state_size, V = 1); A is S4D-real
initialised (A[c, n] = -(n+1))."""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..layers import ShortConv
from .base import Mixer


class Mamba(Mixer):

    def __init__(self, cfg):
        super().__init__(cfg)
        d, N = cfg.hidden_size, cfg.state_size
        self.Di, self.N, self.R = cfg.expand * d, N, math.ceil(d / 16)
        self.in_proj = nn.Linear(d, 2 * self.Di, bias=False)
        self.conv = ShortConv(self.Di, cfg.conv_size, bias=True)
        self.x_proj = nn.Linear(self.Di, self.R + 2 * N, bias=False)
        self.dt_proj = nn.Linear(self.R, self.Di, bias=False)
        dt = torch.exp(torch.rand(self.Di) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3)).clamp(min=1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # kept apart so the LM init leaves it
        self.A_log = nn.Parameter(torch.log(torch.arange(1, N + 1, dtype=torch.float32)).repeat(self.Di, 1))
        self.D = nn.Parameter(torch.ones(self.Di))
        for p in (self.A_log, self.dt_bias, self.D):
            p._no_weight_decay = True
        self.out_proj = nn.Linear(self.Di, d, bias=False)

    def _forward(self, x, state, mode):
        B, T, _ = x.shape
        Di, N = self.Di, self.N
        xs, z = self.in_proj(x).chunk(2, dim=-1)
        xs, conv = self.conv(xs, state.get("conv"))
        dt, Bm, Cm = self.x_proj(xs).split([self.R, N, N], dim=-1)
        dt = F.softplus(self.dt_proj(dt) + self.dt_bias)                    # [B, T, Di]
        w = dt[..., None] * -self.A_log.exp()                               # [B, T, Di, N]
        k = Bm[:, :, None].expand(B, T, Di, N)
        q = Cm[:, :, None].expand(B, T, Di, N)
        o, S = self.recurrence(mode, q, k, (dt * xs)[..., None], w, state.get("S"))
        y = o[..., 0] + self.D * xs
        self._keep(q=Cm, k=Bm, v=xs, g=dt)
        return self.out_proj(y * F.silu(z)), {"S": S, "conv": conv}
