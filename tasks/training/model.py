"""The trial's model, the tasks' side: built from dpx.models seeded by the trial seed (so the initial weights are
a function of the trial), and its parameter count. Every parameter count in tasks/ goes through `num_params`."""
from __future__ import annotations

import torch
from torch import nn

from dpx.models import build_model


def build_seeded_model(model_config: dict, seed: int) -> nn.Module:
    """dpx.models.build_model after torch.manual_seed(seed)."""
    torch.manual_seed(seed)
    return build_model(model_config)


def num_params(model: nn.Module) -> int:
    """Total parameter count of a model or of one of its modules (the NUM_PARAMS summary key)."""
    return sum(p.numel() for p in model.parameters())
