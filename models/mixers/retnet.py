"""RetNet's multi-scale retention: linear attention with a fixed decay per head
(dpx.kernels.gated_linear_recurrence)."""
from __future__ import annotations

import torch

from ..layers import rotary
from .linear_attention import QKVMixer


class RetNet(QKVMixer):
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
        o, S = self.recurrence(mode, q, k, v, w, state.get("S"), scale=self.K ** -0.5)
        self._keep(q=q, k=k, v=v)
        return self.out(x, o), {"S": S, "pos": pos + x.shape[1]}
