"""Linear attention (Katharopoulos et al. 2020) and the q/k/v projections it shares with RetNet and GLA; the
recurrence is dpx.kernels.gated_linear_recurrence with no decay."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..config import ModelConfig
from ..layers import GatedRMSNorm
from .base import Mixer


class QKVMixer(Mixer):
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


class LinearAttention(QKVMixer):
    """Katharopoulos et al. 2020: phi = elu + 1, o_t = phi(q_t)^T S_t / (phi(q_t)^T z_t), S_t = S + phi(k) v^T,
    z_t = z + phi(k). The normaliser rides along as an extra value column of ones."""

    def __init__(self, cfg):
        super().__init__(cfg, gate=False)

    def _forward(self, x, state, mode):
        q, k, v = self.qkv(x)
        q, k = F.elu(q) + 1, F.elu(k) + 1
        v1 = torch.cat([v, torch.ones_like(v[..., :1])], -1)
        w = q.new_zeros(*q.shape[:-1], 1)
        o, S = self.recurrence(mode, q, k, v1, w, state.get("S"))
        o = o[..., :-1] / (o[..., -1:] + 1e-6)
        self._keep(q=q, k=k, v=v)
        return self.out(x, o), {"S": S}
