"""The chunk-parallel parts of the chunkwise algorithm in PyTorch, differentiable: the backward recomputes
through these with autograd, around the serial state recurrence (chunk_h.py), which has its own Triton backward.

prepare: (k, v, beta, g) -> W, U, Kd, gamma, G per chunk     (see torch_chunk.py for the algebra)
output:  (q, k, G, h, v_new) -> o
"""
from __future__ import annotations

import torch

from .index import BL, ChunkTable


def _pad_gather(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x [M, H, ...] gathered at idx [NC, R] (M means a zero row) -> [NC, H, R, ...]."""
    x = torch.cat([x, x.new_zeros(1, *x.shape[1:])])
    y = x[idx]
    return y.transpose(1, 2)


def prepare(k, v, beta, g, tab: ChunkTable, step_idx):
    """k [NTOK*n, H, K], v [NTOK*n, H, V], beta [NTOK*n, H], g [NTOK, H] or None (all float32).

    Returns W [NC,H,BL,K], U [NC,H,BL,V], Kd [NC,H,BL,K] (keys decayed to the chunk end), gamma [NC,H] (chunk
    decay) and G [NC,H,BL] (in-chunk cumulative log gate at every step)."""
    n = tab.n
    kc, vc, bc = _pad_gather(k, step_idx), _pad_gather(v, step_idx), _pad_gather(beta, step_idx)
    if g is None:
        G = bc.new_zeros(bc.shape)
    else:
        gi = torch.cat([g[:, None], g.new_zeros(g.shape[0], n - 1, g.shape[1])], 1).reshape(-1, g.shape[1])
        G = _pad_gather(gi, step_idx).cumsum(-1)
    o = torch.arange(BL, device=k.device)
    strict = o[:, None] > o[None, :]
    d = G[..., :, None] - G[..., None, :]
    decay = torch.where(strict, d, torch.zeros_like(d)).exp() * strict
    A = bc[..., None] * (kc @ kc.transpose(-1, -2)) * decay
    IA = A + torch.eye(BL, dtype=A.dtype, device=A.device)
    W = torch.linalg.solve_triangular(IA, (bc * G.exp())[..., None] * kc, upper=False, unitriangular=True)
    U = torch.linalg.solve_triangular(IA, bc[..., None] * vc, upper=False, unitriangular=True)
    Kd = kc * (G[..., -1:] - G).exp()[..., None]
    return W, U, Kd, G[..., -1].exp(), G, kc


def output(q, kc, G, h, v_new, tab: ChunkTable, tok_idx, valid_t, scale: float):
    """q [NTOK, H, K]; kc [NC,H,BL,K]; G [NC,H,BL]; h [NC,H,K,V] (state at each chunk start); v_new [NC,H,BL,V].
    Returns o [NTOK, H, V]: o_t = scale (exp(G_t) q_t h + sum_{s <= t's last step} exp(G_t - G_s) (q_t.k_s) v_new_s)."""
    n, BT = tab.n, tab.BT
    qc = _pad_gather(q, tok_idx)  # [NC,H,BT,K]
    i_q = torch.arange(BT, device=q.device) * n + n - 1
    Gq = G[..., i_q]
    m = i_q[:, None] >= torch.arange(BL, device=q.device)[None, :]
    d = Gq[..., :, None] - G[..., None, :]
    decay = torch.where(m, d, torch.zeros_like(d)).exp() * m
    P = (qc @ kc.transpose(-1, -2)) * decay
    oc = (qc * Gq.exp()[..., None]) @ h + P @ v_new
    oc = oc.transpose(1, 2).reshape(-1, *oc.shape[1:2], oc.shape[-1])  # [NC*BT, H, V]
    return oc[valid_t.reshape(-1)] * scale
