"""Linear attention, RetNet, GLA and Mamba-2: additive outer-product updates with (no / static / data-dependent)
decay, all computed by `core` (chunkwise-parallel or recurrent)."""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..config import ModelConfig
from ..layers import GatedRMSNorm, RMSNorm, ShortConv, rotary
from . import core
from .base import Mixer


def run_core(mixer: Mixer, mode: str, q, k, v, w, S0=None, scale=1.0, a=None, b=None, u=None):
    """Dispatch to the chunkwise or the recurrent form of `core` (chunk default: 64 for scalar decays, 16 for
    per-channel ones, whose pairwise decay tensor is K times larger)."""
    dt = q.dtype
    if dt in (torch.float16, torch.bfloat16) or torch.is_autocast_enabled(q.device.type):
        # cumulative log decays and the triangular solve need float32: leave autocast, upcast, cast back
        with torch.autocast(q.device.type, enabled=False):
            f = lambda x: None if x is None else x.float()  # noqa: E731
            o, S = run_core(mixer, mode, f(q), f(k), f(v), f(w), f(S0), scale, f(a), f(b), f(u))
        return o.to(dt), S
    if mode == "recurrent":
        return core.recurrent(q, k, v, w, a, b, u, S0, scale)
    C = mixer.cfg.chunk_size or (64 if w.shape[-1] == 1 else 16)
    return core.chunked(q, k, v, w, a, b, u, S0, scale, chunk_size=C)


class _QKVMixer(Mixer):
    """Shared projections of the attention-like families: q, k [H, K], v [H, V], output projection."""

    def __init__(self, cfg: ModelConfig, gate: bool):
        super().__init__(cfg)
        d, H, K, V = cfg.hidden_size, cfg.num_heads, cfg.key_dim, cfg.value_dim
        self.H, self.K, self.V = H, K, V
        self.q_proj = nn.Linear(d, H * K, bias=False)
        self.k_proj = nn.Linear(d, H * K, bias=False)
        self.v_proj = nn.Linear(d, H * V, bias=False)
        self.g_proj = nn.Linear(d, H * V, bias=False) if gate else None
        self.o_norm = GatedRMSNorm(V, eps=cfg.norm_eps) if gate else None
        self.o_proj = nn.Linear(H * V, d, bias=False)

    def qkv(self, x):
        B, T, _ = x.shape
        return (self.q_proj(x).view(B, T, self.H, self.K), self.k_proj(x).view(B, T, self.H, self.K),
                self.v_proj(x).view(B, T, self.H, self.V))

    def out(self, x, o):
        B, T, _ = x.shape
        if self.g_proj is not None:
            # per-head RMSNorm, then swish output gate (RetNet, GLA). The RetNet and GLA papers normalise each head
            # with GroupNorm (mean-centred, a bias); fla's MultiScaleRetention and GatedLinearAttention (the
            # implementations the DeltaProduct paper's baselines ran) use an RMSNorm per head, and so does dpx
            o = self.o_norm(o, self.g_proj(x).view(B, T, self.H, self.V))
        return self.o_proj(o.reshape(B, T, -1))


class LinearAttention(_QKVMixer):
    """Katharopoulos et al. 2020: phi = elu + 1, o_t = phi(q_t)^T S_t / (phi(q_t)^T z_t), S_t = S + phi(k) v^T,
    z_t = z + phi(k). The normaliser rides along as an extra value column of ones."""

    def __init__(self, cfg):
        super().__init__(cfg, gate=False)

    def _forward(self, x, state, mode):
        q, k, v = self.qkv(x)
        q, k = F.elu(q) + 1, F.elu(k) + 1
        v1 = torch.cat([v, torch.ones_like(v[..., :1])], -1)
        w = q.new_zeros(*q.shape[:-1], 1)
        o, S = run_core(self, mode, q, k, v1, w, state.get("S"))
        o = o[..., :-1] / (o[..., -1:] + 1e-6)
        self._keep(q=q, k=k, v=v)
        return self.out(x, o), {"S": S}


class RetNet(_QKVMixer):
    """Multi-scale retention (Sun et al. 2023): S_t = gamma_h S + k v^T with a fixed decay per head,
    gamma_h = 1 - 2^(-5-h), xPos/RoPE on q and k, per-head norm and a swish output gate."""

    def __init__(self, cfg):
        super().__init__(cfg, gate=True)
        if self.K % 2:
            raise ValueError(f"head_dim: retnet's rotary needs an even head_dim, got {self.K}")
        self.register_buffer("log_gamma", torch.log(1 - 2.0 ** (-5.0 - torch.arange(self.H, dtype=torch.float64))),
                             persistent=False)

    def _forward(self, x, state, mode):
        q, k, v = self.qkv(x)
        pos = state.get("pos", 0)
        q, k = rotary(q, pos, self.cfg.rope_theta), rotary(k, pos, self.cfg.rope_theta)
        w = self.log_gamma.to(x.dtype)[None, None, :, None].expand(*q.shape[:-1], 1)
        o, S = run_core(self, mode, q, k, v, w, state.get("S"), scale=self.K ** -0.5)
        self._keep(q=q, k=k, v=v)
        return self.out(x, o), {"S": S, "pos": pos + x.shape[1]}


class GLA(_QKVMixer):
    """Gated linear attention (Yang et al. 2024): S_t = diag(alpha_t) S + k v^T, log alpha_t =
    logsigmoid(low-rank(x)) / 16 per key channel; per-head norm and swish output gate."""

    def __init__(self, cfg):
        super().__init__(cfg, gate=True)
        r = cfg.low_rank_dim
        self.gk_proj = nn.Sequential(nn.Linear(cfg.hidden_size, r, bias=False),
                                     nn.Linear(r, self.H * self.K, bias=True))

    def _forward(self, x, state, mode):
        B, T, _ = x.shape
        q, k, v = self.qkv(x)
        w = F.logsigmoid(self.gk_proj(x)).view(B, T, self.H, self.K) / 16
        o, S = run_core(self, mode, q, k, v, w, state.get("S"), scale=self.K ** -0.5)
        self._keep(q=q, k=k, v=v, g=w)
        return self.out(x, o), {"S": S}


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
        o, S = run_core(self, mode, q, k, xs * dt[..., None], w, state.get("S"))
        y = o + self.D[:, None] * xs
        self._keep(q=Cm, k=Bm, v=xs, g=w[..., 0])
        y = self.norm(y.reshape(B, T, Di) * F.silu(z))  # gate, then normalise (not RMSNorm(y) * SiLU(z))
        return self.out_proj(y), {"S": S, "conv": conv}
