"""Chunkwise DeltaProduct in plain PyTorch (WY / UT-transform form): the CPU path of the models.

The n keys of each token are interleaved into a sequence of T*n delta-rule steps whose log gate is g_t on the
first sub-step of token t and 0 on the others. Within a chunk of BT tokens (L = BT*n steps), with Gamma the
in-chunk cumulative log gate and S0 the state at the chunk start, the state after step i is

    S_i = exp(Gamma_i) S0 + sum_{s<=i} exp(Gamma_i - Gamma_s) k_s u_s^T,
    (I + A) u = beta*v - beta*exp(Gamma)*k S0,   A_is = beta_i exp(Gamma_i - Gamma_s) k_i.k_s  (s < i),

so u = U - W S0 with U = (I+A)^-1 (beta v), W = (I+A)^-1 (beta exp(Gamma) k). Token t reads the state after
its last sub-step i_t = t*n + n-1:  o_t = scale (exp(Gamma_{i_t}) q_t S0 + sum_{s<=i_t} exp(Gamma_{i_t}-Gamma_s)
(q_t.k_s) u_s). Only differences Gamma_i - Gamma_s (<= 0 for i >= s) are exponentiated, so zero and very
negative gates are both safe. Everything is differentiable by autograd; the chunk loop is the only serial part.
"""
from __future__ import annotations

import torch

from .naive import check_inputs, compute_dtype, l2norm, segments


def _chunk_fwd(q, k, v, g, beta, n: int, scale: float, S0, BT: int):
    """One batch of equal-length sequences. q [B,H,T,K]; k [B,H,T*n,K]; v [B,H,T*n,V]; g [B,H,T] or None;
    beta [B,H,T*n]; S0 [B,H,K,V] or None. Returns o [B,H,T,V], S [B,H,K,V]."""
    B, H, T, K = q.shape
    V = v.shape[-1]
    S = q.new_zeros(B, H, K, V) if S0 is None else S0
    if T == 0:
        return q.new_zeros(B, H, 0, V), S
    NT = -(-T // BT)
    pad = NT * BT - T
    if pad:  # identity steps: zero keys, zero beta, zero log gate
        q = torch.nn.functional.pad(q, (0, 0, 0, pad))
        k = torch.nn.functional.pad(k, (0, 0, 0, pad * n))
        v = torch.nn.functional.pad(v, (0, 0, 0, pad * n))
        beta = torch.nn.functional.pad(beta, (0, pad * n))
        g = None if g is None else torch.nn.functional.pad(g, (0, pad))
    L = BT * n
    q = q.view(B, H, NT, BT, K)
    k = k.view(B, H, NT, L, K)
    v = v.view(B, H, NT, L, V)
    beta = beta.view(B, H, NT, L)
    if g is None:
        G = q.new_zeros(B, H, NT, L)
    else:  # gate on sub-step 0 of each token, then the in-chunk cumulative sum
        gi = torch.cat([g.view(B, H, NT, BT, 1), g.new_zeros(B, H, NT, BT, n - 1)], -1)
        G = gi.view(B, H, NT, L).cumsum(-1)
    i_l = torch.arange(L, device=q.device)
    i_q = torch.arange(BT, device=q.device) * n + n - 1  # step index of each token's read-out
    m_strict = i_l[:, None] > i_l[None, :]
    m_out = i_q[:, None] >= i_l[None, :]

    def decay(rows, mask):  # exp(G_rows - G_cols) where mask, 0 elsewhere, never exp of a positive number
        d = rows[..., :, None] - G[..., None, :]
        return torch.where(mask, d, torch.zeros_like(d)).exp() * mask

    A = beta[..., None] * (k @ k.transpose(-1, -2)) * decay(G, m_strict)
    eye = torch.eye(L, dtype=q.dtype, device=q.device)
    IA = eye + A
    W = torch.linalg.solve_triangular(IA, (beta * G.exp())[..., None] * k, upper=False, unitriangular=True)
    U = torch.linalg.solve_triangular(IA, beta[..., None] * v, upper=False, unitriangular=True)
    Gq = G[..., i_q]
    P = (q @ k.transpose(-1, -2)) * decay(Gq, m_out) * scale  # [B,H,NT,BT,L]
    qg = q * (Gq.exp() * scale)[..., None]
    kg = k * (G[..., -1:] - G).exp()[..., None]
    g_last = G[..., -1].exp()[..., None, None]

    outs = []
    for c in range(NT):
        u = U[:, :, c] - W[:, :, c] @ S
        outs.append(qg[:, :, c] @ S + P[:, :, c] @ u)
        S = g_last[:, :, c] * S + kg[:, :, c].transpose(-1, -2) @ u
    o = torch.stack(outs, 2).view(B, H, NT * BT, V)[:, :, :T]
    return o, S


def torch_chunk_gated_delta_product(
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
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Same contract as `naive_recurrent_gated_delta_product`; chunk_size is in tokens (default ~64/n steps)."""
    check_inputs(q, k, v, g, beta, num_householder, initial_state, cu_seqlens)
    n = num_householder
    B, T, H, K = q.shape
    dt, o_dtype = compute_dtype(q, k, v, g, beta, initial_state), q.dtype
    scale = K ** -0.5 if scale is None else scale
    BT = chunk_size or max(64 // n, 8)
    q, k, v, beta = q.to(dt), k.to(dt), v.to(dt), beta.to(dt)
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    g = None if g is None else g.to(dt)
    h0 = None if initial_state is None else initial_state.to(dt)

    def heads_first(x):
        return None if x is None else x.transpose(1, 2)

    if cu_seqlens is None:
        o, S = _chunk_fwd(heads_first(q), heads_first(k), heads_first(v), heads_first(g), heads_first(beta),
                          n, scale, h0, BT)
        o = o.transpose(1, 2)
    else:
        os, Ss = [], []
        for i, (_, bos, eos) in enumerate(segments(B, T, cu_seqlens)):
            o_i, S_i = _chunk_fwd(
                heads_first(q[:, bos:eos]), heads_first(k[:, bos * n:eos * n]), heads_first(v[:, bos * n:eos * n]),
                None if g is None else heads_first(g[:, bos:eos]), heads_first(beta[:, bos * n:eos * n]),
                n, scale, None if h0 is None else h0[i:i + 1], BT)
            os.append(o_i.transpose(1, 2))
            Ss.append(S_i)
        o, S = torch.cat(os, 1), torch.cat(Ss, 0)
    return o.to(o_dtype), (S if output_final_state else None)
