"""RWKV-4, -5, -6 and -7 time mixing (the token mixer; the block's SwiGLU stands in for RWKV's channel mixing).

- RWKV-4: per-channel vector state, static decay w, bonus u:  wkv_t = (sum_{i<t} e^{-(t-1-i)w + k_i} v_i +
  e^{u+k_t} v_t) / (same with v = 1); o = sigmoid(r) * wkv. Computed as K = 1 heads (one per channel) with the
  denominator as a second value column; k is clamped at 30 so e^k stays finite in float32.
- RWKV-5: matrix state per head, static per-channel decay: S_t = diag(w) S + k v^T, read with bonus u.
- RWKV-6: as RWKV-5 with data-dependent decay w_t = exp(-exp(w0 + lora(x))) and data-dependent token shift.
- RWKV-7: S_t = (diag(w_t) - kappa (a_t * kappa)^T) S + k~ v^T (in the [K, V] layout; the seed's
  S (diag(w) - kappa^T (a kappa)) in RWKV's [V, K] layout), kappa = l2norm(k * k_k), k~ = k (1 + (a - 1) k_a),
  o = S_t^T r + (r . (r_k * k~)) v. The cross-layer value residual of the full RWKV-7 is left out (a mixer sees
  one layer). allow_neg_eigval lets a range over [0, 2].
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..layers import GatedRMSNorm, token_shift
from .base import Mixer


def _lerp_params(n: int, d: int) -> nn.Parameter:
    return nn.Parameter(torch.rand(n, d))  # static token-shift mixing coefficients in [0, 1]


def no_weight_decay(*params: nn.Parameter) -> None:
    """Exclude from AdamW's weight decay (tasks/training/loop.py reads the mark), as RWKV-LM's trainer does for
    everything but the `.weight` matrices (decays, bonuses, token-shift mixes, the per-channel k/r scales):
    decaying them pulls a decay rate toward exp(-exp(0)) or a mix toward 0 rather than regularising a weight."""
    for p in params:
        p._no_weight_decay = True


class RWKV4(Mixer):

    def __init__(self, cfg):
        super().__init__(cfg)
        d = cfg.hidden_size
        self.mu = _lerp_params(3, d)  # k, v, r
        self.key = nn.Linear(d, d, bias=False)
        self.value = nn.Linear(d, d, bias=False)
        self.receptance = nn.Linear(d, d, bias=False)
        self.output = nn.Linear(d, d, bias=False)
        self.time_decay = nn.Parameter(torch.linspace(-5, 1, d))   # w = exp(time_decay) > 0
        self.time_first = nn.Parameter(torch.full((d,), 0.5))      # u
        no_weight_decay(self.mu, self.time_decay, self.time_first)

    def _forward(self, x, state, mode):
        B, T, d = x.shape
        prev, shift = token_shift(x, state.get("shift"))
        xk, xv, xr = (x * m + prev * (1 - m) for m in self.mu)
        k = self.key(xk).clamp(max=30).exp().view(B, T, d, 1)
        v = self.value(xv).view(B, T, d, 1)
        r = self.receptance(xr)
        w = -self.time_decay.exp()[None, None, :, None].expand(B, T, d, 1)
        q = torch.ones_like(k)
        u = self.time_first.exp()[:, None]
        o, S = self.recurrence(mode, q, k, torch.cat([v, torch.ones_like(v)], -1), w, state.get("S"), u=u)
        wkv = o[..., 0] / (o[..., 1] + 1e-12)
        self._keep(k=k[..., 0], v=v[..., 0], r=r)
        return self.output(torch.sigmoid(r) * wkv), {"S": S, "shift": shift}


class _RWKVMatrix(Mixer):
    """Shared parts of RWKV-5/6: r, k, v, g projections, per-head decay and bonus, norm + SiLU gate."""

    def __init__(self, cfg):
        super().__init__(cfg)
        d, H, K, V = cfg.hidden_size, cfg.num_heads, cfg.key_dim, cfg.value_dim
        self.H, self.K, self.V = H, K, V
        self.r_proj = nn.Linear(d, H * K, bias=False)
        self.k_proj = nn.Linear(d, H * K, bias=False)
        self.v_proj = nn.Linear(d, H * V, bias=False)
        self.g_proj = nn.Linear(d, H * V, bias=False)
        self.o_proj = nn.Linear(H * V, d, bias=False)
        self.o_norm = GatedRMSNorm(V, eps=cfg.norm_eps)
        ratio = torch.arange(H * K, dtype=torch.float32) / max(H * K - 1, 1)
        self.w0 = nn.Parameter((-6 + 5 * ratio ** 0.7).view(H, K))  # log(-log w): decays spread over channels
        self.u = nn.Parameter(torch.full((H, K), 0.5))
        no_weight_decay(self.w0, self.u)

    def finish(self, x, xr, xk, xv, xg, w, state, mode, shift):
        B, T, _ = x.shape
        r = self.r_proj(xr).view(B, T, self.H, self.K)
        k = self.k_proj(xk).view(B, T, self.H, self.K)
        v = self.v_proj(xv).view(B, T, self.H, self.V)
        o, S = self.recurrence(mode, r, k, v, w, state.get("S"), scale=self.K ** -0.5, u=self.u)
        self._keep(q=r, k=k, v=v, g=w)
        o = self.o_norm(o, self.g_proj(xg).view(B, T, self.H, self.V))
        return self.o_proj(o.reshape(B, T, -1)), {"S": S, "shift": shift}


class RWKV5(_RWKVMatrix):

    def __init__(self, cfg):
        super().__init__(cfg)
        self.mu = _lerp_params(4, cfg.hidden_size)  # r, k, v, g
        no_weight_decay(self.mu)

    def _forward(self, x, state, mode):
        B, T, _ = x.shape
        prev, shift = token_shift(x, state.get("shift"))
        xr, xk, xv, xg = (x * m + prev * (1 - m) for m in self.mu)
        w = -self.w0.exp()[None, None].expand(B, T, self.H, self.K)
        return self.finish(x, xr, xk, xv, xg, w, state, mode, shift)


class RWKV6(_RWKVMatrix):

    def __init__(self, cfg):
        super().__init__(cfg)
        d, r = cfg.hidden_size, cfg.low_rank_dim
        self.mu_x = nn.Parameter(torch.rand(d))
        self.mu = _lerp_params(5, d)                     # w, k, v, r, g
        self.shift_lora_a = nn.Linear(d, 5 * r, bias=False)
        self.shift_lora_b = nn.Parameter(torch.zeros(5, r, d))
        self.decay_lora = nn.Sequential(nn.Linear(d, r, bias=False), nn.Tanh(), nn.Linear(r, self.H * self.K, bias=False))
        no_weight_decay(self.mu_x, self.mu, self.shift_lora_b)

    def _forward(self, x, state, mode):
        B, T, d = x.shape
        prev, shift = token_shift(x, state.get("shift"))
        xx = prev - x
        xxx = x + xx * self.mu_x
        lo = torch.tanh(self.shift_lora_a(xxx)).view(B, T, 5, -1)
        m = self.mu[None, None] + torch.einsum("btnr,nrd->btnd", lo, self.shift_lora_b)  # data-dependent lerp
        xw, xk, xv, xr, xg = (x + xx * m[:, :, i] for i in range(5))
        w = -(self.w0 + self.decay_lora(xw).view(B, T, self.H, self.K)).exp()
        return self.finish(x, xr, xk, xv, xg, w, state, mode, shift)


class RWKV7(Mixer):

    def __init__(self, cfg):
        super().__init__(cfg)
        d, H, K, r = cfg.hidden_size, cfg.num_heads, cfg.key_dim, cfg.low_rank_dim
        V = cfg.value_dim
        self.H, self.K, self.V = H, K, V
        self.mu = _lerp_params(6, d)  # r, w, k, v, a, g
        self.r_proj = nn.Linear(d, H * K, bias=False)
        self.k_proj = nn.Linear(d, H * K, bias=False)
        self.v_proj = nn.Linear(d, H * V, bias=False)
        self.o_proj = nn.Linear(H * V, d, bias=False)
        # the decay bias w0 is a parameter of its own (not the LoRA's Linear bias, which the LM init zeroes):
        # fla/RWKV-7's decay_speed + 0.5, spread over channels from -6.5 (slow) to -1.5 (fast), with the first
        # layer's exponent (a mixer does not know its depth; RWKV-7 raises the exponent with the layer index)
        self.w_lora = nn.Sequential(nn.Linear(d, r, bias=False), nn.Tanh(), nn.Linear(r, H * K, bias=False))
        n = torch.arange(H * K, dtype=torch.float32) / max(H * K - 1, 1)
        self.w0 = nn.Parameter(-7 + 5 * n ** 0.85 + 0.5)
        self.a_lora = nn.Sequential(nn.Linear(d, r, bias=False), nn.Linear(r, H * K))
        self.g_lora = nn.Sequential(nn.Linear(d, r, bias=False), nn.Sigmoid(), nn.Linear(r, H * V, bias=False))
        self.k_k = nn.Parameter(torch.full((H, K), 0.85))
        self.k_a = nn.Parameter(torch.ones(H, K))
        self.r_k = nn.Parameter(torch.zeros(H, K))
        self.o_norm = GatedRMSNorm(V, eps=cfg.norm_eps)
        no_weight_decay(self.mu, self.w0, self.k_k, self.k_a, self.r_k)

    def _forward(self, x, state, mode):
        B, T, _ = x.shape
        H, K, V = self.H, self.K, self.V
        prev, shift = token_shift(x, state.get("shift"))
        xr, xw, xk, xv, xa, xg = (x * m + prev * (1 - m) for m in self.mu)
        r = self.r_proj(xr).view(B, T, H, K)
        w = -0.606531 * torch.sigmoid(self.w_lora(xw) + self.w0).view(B, T, H, K)  # log decay in (-e^-0.5, 0)
        k = self.k_proj(xk).view(B, T, H, K)
        v = self.v_proj(xv).view(B, T, H, V)
        a = torch.sigmoid(self.a_lora(xa)).view(B, T, H, K)
        if self.cfg.allow_neg_eigval:
            a = a * 2
        g = self.g_lora(xg)
        kappa = F.normalize(k * self.k_k, dim=-1)
        k = k * (1 + (a - 1) * self.k_a)
        o, S = self.recurrence(mode, r, k, v, w, state.get("S"), a=-(a * kappa), b=kappa)
        self._keep(q=r, k=k, v=v, kappa=kappa, a=a, g=w)
        o = self.o_norm(o) + (r * self.r_k * k).sum(-1, keepdim=True) * v
        return self.o_proj((o * g.view(B, T, H, V)).reshape(B, T, -1)), {"S": S, "shift": shift}
