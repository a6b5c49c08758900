"""The token loop of the linear recurrence (see the package docstring): the reference every other form is tested
against, computed in the inputs' dtype (float64 inputs: float64 throughout). Differentiable by autograd."""
from __future__ import annotations

import torch


def naive_gated_linear_recurrence(q, k, v, w, *, a=None, b=None, u=None, initial_state=None, scale: float = 1.0):
    """q, k [B, T, H, K]; v [B, T, H, V]; w [B, T, H, K|1]; a, b [B, T, H, K]; u [H, K]; initial_state
    [B, H, K, V] or None (zeros). Returns (o [B, T, H, V], final state [B, H, K, V])."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    S = q.new_zeros(B, H, K, V) if initial_state is None else initial_state.to(q.dtype)
    outs = []
    for t in range(T):
        prev = S
        S = w[:, t].exp()[..., None] * S + k[:, t, :, :, None] * v[:, t, :, None, :]
        if a is not None:
            x = torch.einsum("bhkv,bhk->bhv", prev, b[:, t])
            S = S + a[:, t, :, :, None] * x[:, :, None, :]
        if u is None:
            o = torch.einsum("bhkv,bhk->bhv", S, q[:, t])
        else:
            bonus = (q[:, t] * u * k[:, t]).sum(-1, keepdim=True)
            o = torch.einsum("bhkv,bhk->bhv", prev, q[:, t]) + bonus * v[:, t]
        outs.append(o * scale)
    o = torch.stack(outs, 1) if outs else q.new_zeros(B, 0, H, V)
    return o, S
