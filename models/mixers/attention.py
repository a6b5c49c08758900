"""Transformer++ baseline: softmax attention with RoPE through torch SDPA (the block supplies RMSNorm and
SwiGLU). Its "state" is the KV cache, which grows with the sequence: the one family without an O(1) state."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..layers import rotary
from .base import Mixer


class Attention(Mixer):

    def __init__(self, cfg):
        super().__init__(cfg)
        d, H, K = cfg.hidden_size, cfg.num_heads, cfg.key_dim
        self.H, self.K = H, K
        self.q_proj = nn.Linear(d, H * K, bias=False)
        self.k_proj = nn.Linear(d, H * K, bias=False)
        self.v_proj = nn.Linear(d, H * K, bias=False)
        self.o_proj = nn.Linear(H * K, d, bias=False)

    def _forward(self, x, state, mode):
        B, T, _ = x.shape
        pos = state.get("pos", 0)
        q = rotary(self.q_proj(x).view(B, T, self.H, self.K), pos, self.cfg.rope_theta).transpose(1, 2)
        k = rotary(self.k_proj(x).view(B, T, self.H, self.K), pos, self.cfg.rope_theta).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.H, self.K).transpose(1, 2)
        if "k" in state:
            k, v = torch.cat([state["k"], k], 2), torch.cat([state["v"], v], 2)
        if pos == 0:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # queries at positions pos..pos+T-1 see keys 0..their own position
            mask = torch.arange(pos + T, device=x.device)[None, :] <= torch.arange(pos, pos + T, device=x.device)[:, None]
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        self._keep(q=q.transpose(1, 2), k=k.transpose(1, 2), v=v.transpose(1, 2))
        return self.o_proj(o.transpose(1, 2).reshape(B, T, -1)), {"k": k, "v": v, "pos": pos + T}
