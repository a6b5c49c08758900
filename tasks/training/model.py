"""The trial's model, the tasks' side: dpx.models' model seeded by the trial seed, so the initial weights are a
function of the trial. (Parameters are counted by dpx.models.num_params, the one count dpx reports.)"""
from __future__ import annotations

import torch
from torch import nn

from dpx.models import build_model


def build_seeded_model(model_config: dict, seed: int) -> nn.Module:
    """dpx.models.build_model after torch.manual_seed(seed)."""
    torch.manual_seed(seed)
    return build_model(model_config)
