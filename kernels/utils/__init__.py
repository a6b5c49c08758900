"""Small helpers shared by the Triton kernels (imported lazily: this module imports triton)."""
from __future__ import annotations

import functools
import os

import torch
import triton

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
NO_AUTOTUNE = INTERPRET or os.environ.get("DPX_NO_AUTOTUNE", "0") == "1"  # tests on a GPU: compile one config
# Fault hunting (benchmarks/gpu_check.py sets these in a failing case's rerun, never in normal use):
#   DPX_KERNEL_SYNC=1                      synchronize after every launch and name the kernel that faulted
#   DPX_AUTOTUNE_PIN=kernel:i[,kernel:j]   give that kernel's autotuner only its i-th config
SYNC = os.environ.get("DPX_KERNEL_SYNC", "0") == "1"
PINS = {name: int(i) for name, i in (p.split(":") for p in os.environ.get("DPX_AUTOTUNE_PIN", "").split(",") if p)}


def autotune_configs(configs: list, default: dict | None = None, warps: int = 4) -> list:
    """All configs on a real GPU; a single one (default, `warps` warps, one stage) under TRITON_INTERPRET or
    DPX_NO_AUTOTUNE=1."""
    if NO_AUTOTUNE:
        return [triton.Config(default or {}, num_warps=warps, num_stages=1)]
    return configs


def autotuner(kernel):
    """The triton Autotuner inside a (heuristics-wrapped) kernel, or None when the kernel is not autotuned."""
    while kernel is not None and not isinstance(kernel, triton.runtime.Autotuner):
        kernel = getattr(kernel, "fn", None)
    return kernel


def kernel_name(kernel) -> str:
    while hasattr(kernel, "fn"):
        kernel = kernel.fn
    return kernel.__name__


def launch(kernel, grid, *args, **kwargs):
    """kernel[grid](*args, **kwargs), with the fault-hunting switches above applied (nothing else on the hot path
    when both are off: decode launches a kernel per token)."""
    if PINS:
        name = kernel_name(kernel)
        at = autotuner(kernel)
        if name in PINS and at is not None and not getattr(at, "dpx_pinned", False):
            at.configs, at.dpx_pinned = [at.configs[PINS[name]]], True
    if not SYNC:
        kernel[grid](*args, **kwargs)
        return
    try:  # the launch itself raises when the fault happens while the autotuner times its configs
        kernel[grid](*args, **kwargs)
        torch.cuda.synchronize()
    except Exception as e:  # the context is lost after a fault: say which kernel, then let it die
        at = autotuner(kernel)
        cfg = None if at is None else getattr(at, "best_config", None)
        raise RuntimeError(f"DPX_KERNEL_FAULT {kernel_name(kernel)} config={cfg}: {e}") from e


def fused_impl(impl: str, x: torch.Tensor) -> str:
    """impl of a kernels/fused op: "auto" is Triton on CUDA, and the PyTorch form elsewhere or while torch.compile
    traces (the compiler fuses that form itself; see kernels/fused/__init__)."""
    if impl == "auto":
        return "triton" if x.is_cuda and not torch.compiler.is_compiling() else "torch"
    return impl


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
