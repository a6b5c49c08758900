"""GLA, gated linear attention: a data-dependent decay per key channel (dpx.kernels.gated_linear_recurrence)."""
from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F

from .linear_attention import QKVMixer


class GLA(QKVMixer):
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
        o, S = self.recurrence(mode, q, k, v, w, state.get("S"), scale=self.K ** -0.5)
        self._keep(q=q, k=k, v=v, g=w)
        return self.out(x, o), {"S": S}
