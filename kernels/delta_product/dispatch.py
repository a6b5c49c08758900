"""The entry points of the DeltaProduct op: the one place an implementation is chosen.

`gated_delta_product` (training/prefill) and `gated_delta_product_step` (decode) take fla's argument order
(q, k, v, g, beta) with everything after beta keyword-only, and resolve `impl` ("auto": DPX_KERNEL_IMPL, else
Triton on CUDA and PyTorch elsewhere) through `dpx.kernels.resolve_impl`. Triton modules load only when chosen.
"""
from __future__ import annotations

import torch

from .. import resolve_impl
from .naive import naive_recurrent_gated_delta_product
from .torch_chunk import torch_chunk_gated_delta_product


def gated_delta_product(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None,
    beta: torch.Tensor,
    *,
    num_householder: int = 1,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    chunk_size: int | None = None,
    impl: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunkwise (Gated) DeltaProduct; returns (o [B, T, H, V], final_state [N, H, K, V] float32 or None).

    impl "triton" (the Triton chunk kernel), "torch" (PyTorch chunkwise, chunks of `chunk_size` tokens, default
    ~64 / n_h), "naive" (the token loop) or "auto". `chunk_size` concerns the PyTorch form only: the Triton
    kernel's chunks are fixed (64 // n_h tokens) and the token loop has none."""
    impl = resolve_impl(impl, q.device)
    kw = dict(num_householder=num_householder, scale=scale, initial_state=initial_state,
              output_final_state=output_final_state, cu_seqlens=cu_seqlens,
              use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
    if impl == "triton":
        from .chunk import chunk_gated_delta_product
        return chunk_gated_delta_product(q, k, v, g, beta, **kw)
    if impl == "naive":
        return naive_recurrent_gated_delta_product(q, k, v, g, beta, **kw)
    return torch_chunk_gated_delta_product(q, k, v, g, beta, chunk_size=chunk_size, **kw)


def gated_delta_product_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None,
    beta: torch.Tensor,
    *,
    state: torch.Tensor | None = None,
    num_householder: int = 1,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    impl: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode one or a few tokens (q [B, t, H, K], t small) from `state` [B, H, K, V] (None = zeros).

    Returns (o [B, t, H, V], new state [B, H, K, V] float32). "auto" uses the Triton recurrent kernel on CUDA and
    the PyTorch chunkwise form on CPU (which for a few tokens is as fast as anything else there).
    """
    impl = resolve_impl(impl, q.device)
    kw = dict(num_householder=num_householder, scale=scale, initial_state=state, output_final_state=True,
              use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
    if impl == "triton":
        from .fused_recurrent import fused_recurrent_gated_delta_product
        return fused_recurrent_gated_delta_product(q, k, v, g, beta, **kw)
    if impl == "torch":
        return torch_chunk_gated_delta_product(q, k, v, g, beta, **kw)
    return naive_recurrent_gated_delta_product(q, k, v, g, beta, **kw)
