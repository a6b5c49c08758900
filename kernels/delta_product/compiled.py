"""The chunk kernel as two registered custom ops, so torch.compile traces the model around it in one graph.

    dpx::chunk_dp_fwd(q, k, v, g?, beta, h0?, cu_seqlens?, n, scale, output_final_state)
        -> (o [B,T,H,V], final state [N,H,K,V] float32 (or [0]), T [NC,H,64,64], G [NC,H,64], gamma [NC,H])
    dpx::chunk_dp_bwd(q, k, v, g?, beta, h0?, T, G, gamma, do, dht?, cu_seqlens?, n, scale)
        -> (dq, dk, dv, dg (or [0]), dbeta, dh0 (or [0]))

They run chunk.chunk_forward / chunk.chunk_backward, the bodies of the eager autograd.Function, on the same chunk
table, so compiled and eager training launch the same kernels. The compiler sees each op as one node: its fake
(meta) implementation gives the output shapes (the number of chunks is data-dependent for varlen input, an unbacked
size), and the autograd formula calls the backward op. chunk_gated_delta_product routes here only while
torch.compile traces (torch.compiler.is_compiling()); custom ops cannot return None, so absent outputs are [0]
tensors, mapped back to None below.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .index import BL, chunk_table, tokens_per_chunk


def _table(q: Tensor, n: int, cu_seqlens: Tensor | None):
    B, T = q.shape[:2]
    return chunk_table(B, T, n, q.device, cu_seqlens)


@torch.library.custom_op("dpx::chunk_dp_fwd", mutates_args=())
def chunk_dp_fwd_op(q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, beta: Tensor, h0: Tensor | None,
                    cu_seqlens: Tensor | None, n: int, scale: float, output_final_state: bool
                    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    from .chunk import chunk_forward
    c = lambda x: None if x is None else x.contiguous()
    o, ht, (t, G, gamma) = chunk_forward(c(q), c(k), c(v), c(g), c(beta), c(h0), _table(q, n, cu_seqlens), scale,
                                         output_final_state)
    return o, (ht if ht is not None else q.new_empty(0, dtype=torch.float32)), t, G, gamma


@chunk_dp_fwd_op.register_fake
def _(q, k, v, g, beta, h0, cu_seqlens, n, scale, output_final_state):
    B, T, H, K = q.shape
    V = v.shape[-1]
    if cu_seqlens is None:
        N, NC = B, B * (-(-T // tokens_per_chunk(n)))
    else:
        N, NC = cu_seqlens.shape[0] - 1, torch.library.get_ctx().new_dynamic_size()
    o = q.new_empty(B, T, H, V)
    ht = q.new_empty(N, H, K, V, dtype=torch.float32) if output_final_state else q.new_empty(0, dtype=torch.float32)
    return (o, ht, k.new_empty(NC, H, BL, BL), q.new_empty(NC, H, BL, dtype=torch.float32),
            q.new_empty(NC, H, dtype=torch.float32))


@torch.library.custom_op("dpx::chunk_dp_bwd", mutates_args=())
def chunk_dp_bwd_op(q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, beta: Tensor, h0: Tensor | None, t: Tensor,
                    G: Tensor, gamma: Tensor, do: Tensor, dht: Tensor | None, cu_seqlens: Tensor | None, n: int,
                    scale: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    from .chunk import chunk_backward
    c = lambda x: None if x is None else x.contiguous()
    saved = tuple(c(x) for x in (q, k, v, g, beta, h0, t, G, gamma))
    dq, dk, dv, dg, dbeta, dh0 = chunk_backward(saved, c(do), c(dht), _table(q, n, cu_seqlens), scale, cu_seqlens)
    e = lambda: q.new_empty(0, dtype=torch.float32)  # one per absent output: returns must not alias each other
    return dq, dk, dv, (dg if dg is not None else e()), dbeta, (dh0 if dh0 is not None else e())


@chunk_dp_bwd_op.register_fake
def _(q, k, v, g, beta, h0, t, G, gamma, do, dht, cu_seqlens, n, scale):
    e = lambda: q.new_empty(0, dtype=torch.float32)
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
            torch.empty_like(g) if g is not None else e(), torch.empty_like(beta),
            torch.empty_like(h0) if h0 is not None else e())


def _setup_context(ctx, inputs, output):
    q, k, v, g, beta, h0, cu_seqlens, n, scale, output_final_state = inputs
    _, _, t, G, gamma = output
    ctx.save_for_backward(q, k, v, g, beta, h0, t, G, gamma, cu_seqlens)
    ctx.n, ctx.scale, ctx.has_ht = n, scale, output_final_state
    ctx.has_g, ctx.has_h0 = g is not None, h0 is not None
    ctx.mark_non_differentiable(t, G, gamma)


def _backward(ctx, do, dht, _dt, _dG, _dgamma):
    q, k, v, g, beta, h0, t, G, gamma, cu_seqlens = ctx.saved_tensors
    dq, dk, dv, dg, dbeta, dh0 = chunk_dp_bwd_op(q, k, v, g, beta, h0, t, G, gamma, do,
                                                 dht if ctx.has_ht else None, cu_seqlens, ctx.n, ctx.scale)
    return (dq, dk, dv, dg if ctx.has_g else None, dbeta, dh0 if ctx.has_h0 else None, None, None, None, None)


chunk_dp_fwd_op.register_autograd(_backward, setup_context=_setup_context)


def chunk_dp_apply(q, k, v, g, beta, h0, cu_seqlens, n: int, scale: float, output_final_state: bool):
    """(o, final state or None), as ChunkGatedDeltaProductFunction.apply, through the custom ops."""
    o, ht, _, _, _ = chunk_dp_fwd_op(q, k, v, g, beta, h0, cu_seqlens, n, scale, output_final_state)
    return o, (ht if output_final_state else None)
