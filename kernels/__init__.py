"""dpx.kernels: the recurrences of every model family, one folder per op (fla's layout).

- `delta_product/`: (Gated) DeltaProduct (n_h = 1 is (Gated) DeltaNet). Every entry point takes fla's order
  `(q, k, v, g, beta, ...)`:
  - `gated_delta_product(q, k, v, g, beta, *, num_householder=1, ..., impl="auto")`: training/prefill; the one
    place an implementation is chosen (Triton chunk kernel on CUDA, PyTorch chunkwise on CPU, the token loop).
  - `gated_delta_product_step(q, k, v, g, beta, *, state=None, ..., impl="auto")`: decode a few tokens.
  - `chunk_gated_delta_product`, `fused_recurrent_gated_delta_product`: drop-ins for fla's names, float32 accepted
    (the first with fla's positional signature). Triton is imported only when these are first used.
  - `naive_recurrent_gated_delta_product` (the oracle), `torch_chunk_gated_delta_product` (the CPU path).
- `linear_recurrence/`: diagonal decay plus an optional rank-one term, the recurrence of every other family
  (linear attention, RetNet, GLA, RWKV-4..7, Mamba, Mamba-2): `gated_linear_recurrence(q, k, v, w, *, a, b, u, ...,
  impl)`, with `naive_gated_linear_recurrence` (token loop, the oracle) and `torch_chunk_gated_linear_recurrence`.
- `fused/`: the delta layers' glue (short conv, L2 norm, gated RMSNorm) as fused Triton ops.

Delta layouts (fla): q [B, T, H, K]; k [B, T*n, H, K], v [B, T*n, H, V], beta [B, T*n, H] interleaved per token
(index t*n + j); g [B, T, H] log-space per token or None; initial/final state [N, H, K, V] with N = B, or the
number of sequences when `cu_seqlens` [N+1] (token offsets, B = 1) is given.

The environment variable DPX_KERNEL_IMPL ("triton", "torch", "naive") overrides impl="auto".

`import dpx.kernels` imports neither torch nor triton: `IMPLS` lives here so that the torch-free config classes
(models/config.py, imported by recipe expansion) validate `model.impl` against the kernels' own list; every op
loads on first attribute access.
"""
from __future__ import annotations

import importlib
import os

IMPLS = ("auto", "triton", "torch", "naive")

_OPS = {
    "gated_delta_product": ".delta_product.dispatch", "gated_delta_product_step": ".delta_product.dispatch",
    "chunk_gated_delta_product": ".delta_product.chunk",
    "fused_recurrent_gated_delta_product": ".delta_product.fused_recurrent",
    "naive_recurrent_gated_delta_product": ".delta_product.naive",
    "torch_chunk_gated_delta_product": ".delta_product.torch_chunk",
    "gated_linear_recurrence": ".linear_recurrence.dispatch",
    "naive_gated_linear_recurrence": ".linear_recurrence.naive",
    "torch_chunk_gated_linear_recurrence": ".linear_recurrence.torch_chunk",
}
_SUBPACKAGES = ("delta_product", "linear_recurrence", "fused", "utils")

__all__ = ["IMPLS", "resolve_impl", *_OPS]


def resolve_impl(impl: str, device) -> str:
    """Turn "auto" (or DPX_KERNEL_IMPL) into a concrete implementation name for a torch.device; loud on unknown
    names."""
    if impl not in IMPLS:
        raise ValueError(f"impl: expected one of {IMPLS}, got {impl!r}")
    if impl == "auto":
        impl = os.environ.get("DPX_KERNEL_IMPL", "auto") or "auto"
        if impl not in IMPLS:
            raise ValueError(f"DPX_KERNEL_IMPL: expected one of {IMPLS}, got {impl!r}")
    if impl == "auto":
        impl = "triton" if device.type == "cuda" else "torch"
    return impl


def __getattr__(name: str):
    if name in _OPS:
        return getattr(importlib.import_module(_OPS[name], __name__), name)
    if name in _SUBPACKAGES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
