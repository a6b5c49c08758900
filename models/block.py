"""One layer of the LM: x + mixer(RMSNorm(x)), then x + SwiGLU(RMSNorm(x)) (fla's block layout)."""
from __future__ import annotations

import torch.nn as nn

from .config import ModelConfig
from .layers import RMSNorm, SwiGLU
from .mixers import get_mixer


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.attn = get_mixer(cfg.family)(cfg)
        self.mlp = None
        if cfg.mlp_size > 0:
            self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
            self.mlp = SwiGLU(cfg.hidden_size, cfg.mlp_size)

    def forward(self, x, state=None, mode=None):
        y, state = self.attn(self.attn_norm(x), state, mode=mode)
        x = x + y
        if self.mlp is not None:
            x = x + self.mlp(self.mlp_norm(x))
        return x, state

    def step(self, x_t, state=None):
        y, state = self.attn.step(self.attn_norm(x_t), state)
        x_t = x_t + y
        if self.mlp is not None:
            x_t = x_t + self.mlp(self.mlp_norm(x_t))
        return x_t, state
