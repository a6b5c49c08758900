"""Building the trial's model for a training task: seeded, so the initial weights are a function of the trial."""
from __future__ import annotations

import torch
from torch import nn


def build_model(model_config: dict, seed: int) -> nn.Module:
    from dpx.models import build_model as _build

    torch.manual_seed(seed)
    return _build(model_config)


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
