"""dpx.kernels: the DeltaProduct kernel family (n_h = 1 is (Gated) DeltaNet).

Public API:
- `gated_delta_product(q, k, v, beta, g=None, num_householder=1, ..., impl="auto")`: training/prefill entry that
  dispatches to the Triton chunk kernel on CUDA and to the PyTorch chunkwise implementation on CPU.
- `gated_delta_product_step(q, k, v, beta, g=None, state=None, ...)`: decode one or a few tokens, state in and out.
- `chunk_gated_delta_product`, `fused_recurrent_gated_delta_product`: drop-ins for fla's names and argument order
  (q, k, v, g, beta, num_householder, ...), float32 accepted. Triton is imported only when these are first used.
- `naive_recurrent_gated_delta_product`, `torch_chunk_gated_delta_product`: references.

Layouts (fla): q [B, T, H, K]; k [B, T*n, H, K], v [B, T*n, H, V], beta [B, T*n, H] interleaved per token
(index t*n + j); g [B, T, H] log-space per token or None; initial/final state [N, H, K, V] with N = B, or the
number of sequences when `cu_seqlens` [N+1] (token offsets, B = 1) is given.

The environment variable DPX_KERNEL_IMPL ("triton", "torch", "naive") overrides impl="auto".
"""
from __future__ import annotations

import os

import torch

from .delta_product.naive import naive_recurrent_gated_delta_product
from .delta_product.torch_chunk import torch_chunk_gated_delta_product

IMPLS = ("auto", "triton", "torch", "naive")

__all__ = [
    "IMPLS", "gated_delta_product", "gated_delta_product_step", "chunk_gated_delta_product",
    "fused_recurrent_gated_delta_product", "naive_recurrent_gated_delta_product", "torch_chunk_gated_delta_product",
    "resolve_impl",
]


def resolve_impl(impl: str, device: torch.device) -> str:
    """Turn "auto" (or DPX_KERNEL_IMPL) into a concrete implementation name; loud on unknown names."""
    if impl not in IMPLS:
        raise ValueError(f"impl: expected one of {IMPLS}, got {impl!r}")
    if impl == "auto":
        impl = os.environ.get("DPX_KERNEL_IMPL", "auto") or "auto"
        if impl not in IMPLS:
            raise ValueError(f"DPX_KERNEL_IMPL: expected one of {IMPLS}, got {impl!r}")
    if impl == "auto":
        impl = "triton" if device.type == "cuda" else "torch"
    return impl


def gated_delta_product(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor | None = None,
    num_householder: int = 1,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    impl: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunkwise (Gated) DeltaProduct; returns (o [B, T, H, V], final_state [N, H, K, V] float32 or None)."""
    impl = resolve_impl(impl, q.device)
    kw = dict(num_householder=num_householder, scale=scale, initial_state=initial_state,
              output_final_state=output_final_state, cu_seqlens=cu_seqlens,
              use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
    if impl == "triton":
        from .delta_product.chunk import chunk_gated_delta_product as fn
        return fn(q, k, v, g, beta, **kw)
    if impl == "naive":
        return naive_recurrent_gated_delta_product(q, k, v, beta, g, **kw)
    return torch_chunk_gated_delta_product(q, k, v, beta, g, **kw)


def gated_delta_product_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor | None = None,
    state: torch.Tensor | None = None,
    num_householder: int = 1,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    impl: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode one or a few tokens (q [B, t, H, K], t small) from `state` [B, H, K, V] (None = zeros).

    Returns (o [B, t, H, V], new state [B, H, K, V] float32). "auto" uses the Triton recurrent kernel on CUDA and
    the token loop on CPU (which for a few tokens is as fast as anything else there).
    """
    impl = resolve_impl(impl, q.device)
    kw = dict(num_householder=num_householder, scale=scale, initial_state=state, output_final_state=True,
              use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
    if impl == "triton":
        from .delta_product.fused_recurrent import fused_recurrent_gated_delta_product as fn
        return fn(q, k, v, g, beta, **kw)
    if impl == "torch":
        return torch_chunk_gated_delta_product(q, k, v, beta, g, **kw)
    return naive_recurrent_gated_delta_product(q, k, v, beta, g, **kw)


def __getattr__(name: str):
    # the Triton drop-ins are resolved on first use, so `import dpx.kernels` never imports triton
    if name == "chunk_gated_delta_product":
        from .delta_product.chunk import chunk_gated_delta_product
        return chunk_gated_delta_product
    if name == "fused_recurrent_gated_delta_product":
        from .delta_product.fused_recurrent import fused_recurrent_gated_delta_product
        return fused_recurrent_gated_delta_product
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
