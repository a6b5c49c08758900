"""Small helpers shared by the Triton kernels (imported lazily: this module imports triton)."""
from __future__ import annotations

import functools
import os

import torch
import triton

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
NO_AUTOTUNE = INTERPRET or os.environ.get("DPX_NO_AUTOTUNE", "0") == "1"  # tests on a GPU: compile one config


def autotune_configs(configs: list, default: dict | None = None, warps: int = 4) -> list:
    """All configs on a real GPU; a single one (default, `warps` warps, one stage) under TRITON_INTERPRET or
    DPX_NO_AUTOTUNE=1."""
    if NO_AUTOTUNE:
        return [triton.Config(default or {}, num_warps=warps, num_stages=1)]
    return configs


def next_pow2(x: int, floor: int = 16) -> int:
    return max(floor, triton.next_power_of_2(x))


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 data gets tf32x3 (about fp32 accuracy on tensor cores); 16-bit data ignores the flag."""
    return "tf32x3" if dtype == torch.float32 else "tf32"


def contiguous(fn):
    """fla's input_guard, reduced: make every tensor argument contiguous."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        args = [a.contiguous() if isinstance(a, torch.Tensor) else a for a in args]
        kwargs = {k: (v.contiguous() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
        return fn(*args, **kwargs)
    return wrapper
