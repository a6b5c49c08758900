"""Chunkwise (Gated) DeltaProduct in Triton: forward kernels and a torch.autograd.Function.

Forward (three kernels, no interleaved query or gate tensors):
  wy_fast.chunk_dp_fwd_prepare   per chunk: gate cumsum, A = beta k k^T decay, (I+A)^-1 by 16x16 blocks, W, U, Kd
  chunk_h.chunk_dp_fwd_kernel_h  serial over chunks: h (state at each chunk start), v_new = U - W h, final state
  chunk_o.chunk_dp_fwd_o         per chunk: o = scale (exp(G) q h + (q k^T * decay) v_new), only T query rows
Backward: the chunk-parallel parts are recomputed in float32 PyTorch (recompute.py) and differentiated by
autograd; the serial recurrence has its own Triton backward (chunk_h.chunk_dp_bwd_kernel_dh).
"""
from __future__ import annotations

import torch

from ..utils import contiguous, dot_precision
from .index import BL, chunk_table, gather_indices
from .naive import check_inputs, l2norm
from . import recompute
from .chunk_h import StateRecurrence, chunk_dp_fwd_h


def chunk_dp_fwd(q, k, v, g, beta, h0, tab, scale, output_final_state):
    """Flattened inputs: q [NTOK,H,K], k [NTOK*n,H,K], v [NTOK*n,H,V], beta [NTOK*n,H], g [NTOK,H] or None."""
    from .chunk_o import chunk_dp_fwd_o
    from .wy_fast import chunk_dp_fwd_prepare
    prec = dot_precision(q.dtype)
    w, u, kd, gamma, G = chunk_dp_fwd_prepare(k, v, beta, g, tab, prec)
    h, v_new, ht = chunk_dp_fwd_h(w, u, kd, gamma, h0, tab, output_final_state, q.dtype, prec)
    o = chunk_dp_fwd_o(q, k, G, h, v_new, tab, scale, prec)
    return o, ht


def chunk_dp_bwd(q, k, v, g, beta, h0, do, dht, tab, scale):
    """Recompute in float32 with autograd around the Triton recurrence; returns (dq, dk, dv, dg, dbeta, dh0)."""
    tok_idx, step_idx, valid_t = gather_indices(tab)
    xs = [None if x is None else x.detach().float().requires_grad_() for x in (q, k, v, g, beta, h0)]
    q_, k_, v_, g_, b_, h0_ = xs
    with torch.enable_grad():
        w, u, kd, gamma, G, kc = recompute.prepare(k_, v_, b_, g_, tab, step_idx)
        h, v_new, ht = StateRecurrence.apply(w, u, kd, gamma, h0_, tab, "tf32x3")
        o = recompute.output(q_, kc, G, h, v_new, tab, tok_idx, valid_t, scale)
        outs, grads = [o], [do.float()]
        if dht is not None:
            outs.append(ht)
            grads.append(dht.float())
        torch.autograd.backward(outs, grads)
    return [None if x is None else (x.grad if x.grad is not None else torch.zeros_like(x)) for x in xs]


class ChunkGatedDeltaProductFunction(torch.autograd.Function):

    @staticmethod
    @contiguous
    def forward(ctx, q, k, v, g, beta, h0, tab, scale, output_final_state):
        B, T, H, K = q.shape
        V = v.shape[-1]
        flat = lambda x, *s: None if x is None else x.reshape(*s)
        o, ht = chunk_dp_fwd(flat(q, -1, H, K), flat(k, -1, H, K), flat(v, -1, H, V), flat(g, -1, H),
                             flat(beta, -1, H), h0, tab, scale, output_final_state)
        ctx.save_for_backward(q, k, v, g, beta, h0)
        ctx.tab, ctx.scale = tab, scale
        return o.view(B, T, H, V), ht

    @staticmethod
    @contiguous
    def backward(ctx, do, dht):
        q, k, v, g, beta, h0 = ctx.saved_tensors
        B, T, H, K = q.shape
        V = v.shape[-1]
        flat = lambda x, *s: None if x is None else x.reshape(*s)
        dq, dk, dv, dg, dbeta, dh0 = chunk_dp_bwd(
            flat(q, -1, H, K), flat(k, -1, H, K), flat(v, -1, H, V), flat(g, -1, H), flat(beta, -1, H), h0,
            flat(do, -1, H, V), dht, ctx.tab, ctx.scale)
        cast = lambda dx, x: None if dx is None else dx.view(x.shape).to(x.dtype)
        return (cast(dq, q), cast(dk, k), cast(dv, v), cast(dg, g), cast(dbeta, beta), cast(dh0, h0),
                None, None, None)


@torch.compiler.disable
def chunk_gated_delta_product(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None,
    beta: torch.Tensor,
    num_householder: int,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fla-compatible chunkwise (Gated) DeltaProduct (float32 inputs accepted as well as bf16/fp16).

    q [B,T,H,K]; k [B,T*n,H,K], v [B,T*n,H,V], beta [B,T*n,H] interleaved per token; g [B,T,H] log gate or None;
    initial_state [N,H,K,V]; cu_seqlens [N+1] token offsets (B = 1). Returns (o [B,T,H,V], final state float32).
    """
    check_inputs(q, k, v, beta, g, num_householder, initial_state, cu_seqlens)
    B, T, H, K = q.shape
    if K > 256 or v.shape[-1] > 256:
        raise ValueError(f"q/v: head dims up to 256 are supported, got K={K}, V={v.shape[-1]}")
    scale = K ** -0.5 if scale is None else scale
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q.float()).to(q.dtype), l2norm(k.float()).to(k.dtype)
    tab = chunk_table(B, T, num_householder, q.device, cu_seqlens, cu_seqlens_cpu)
    if g is not None:
        g = g.float()
    return ChunkGatedDeltaProductFunction.apply(q, k, v, g, beta, initial_state, tab, scale, output_final_state)
