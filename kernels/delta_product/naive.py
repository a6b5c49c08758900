"""Reference DeltaProduct recurrence: one token at a time, in float32 (float64 when the inputs are float64).

Semantics (fla's `chunk_gated_delta_product`), for token t with keys k_{t,1..n}, values v_{t,1..n}, steps
beta_{t,1..n}, log gate g_t and query q_t, and the state S of shape [K, V]:

    S <- exp(g_t) * S                                   # gate once per token, before the Householder steps
    for j in 1..n:  S <- S + beta_{t,j} k_{t,j} (v_{t,j} - S^T k_{t,j})^T
    o_t = scale * S^T q_t                               # read out once, after the n steps

k, v and beta are interleaved per token: index t*n + j along the time axis. This loop is the oracle every
other implementation is tested against; it is deliberately simple and slow.
"""
from __future__ import annotations

import torch


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """fla's in-kernel l2 norm: x / sqrt(sum(x^2) + eps) over the last axis, computed in x's dtype."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def compute_dtype(*xs: torch.Tensor | None) -> torch.dtype:
    """float64 when any input is float64, else float32 (bf16/fp16 inputs are upcast)."""
    return torch.float64 if any(x is not None and x.dtype == torch.float64 for x in xs) else torch.float32


def check_inputs(q, k, v, g, beta, num_householder, initial_state, cu_seqlens):
    """Shape checks shared by every implementation; raises ValueError naming the argument."""
    n = num_householder
    if n < 1:
        raise ValueError(f"num_householder: must be >= 1, got {n}")
    if q.ndim != 4:
        raise ValueError(f"q: expected [B, T, H, K], got shape {tuple(q.shape)}")
    B, T, H, K = q.shape
    V = v.shape[-1]
    if tuple(k.shape) != (B, T * n, H, K):
        raise ValueError(f"k: expected {(B, T * n, H, K)} (keys interleaved per token), got {tuple(k.shape)}")
    if tuple(v.shape) != (B, T * n, H, V):
        raise ValueError(f"v: expected {(B, T * n, H, V)}, got {tuple(v.shape)}")
    if tuple(beta.shape) != (B, T * n, H):
        raise ValueError(f"beta: expected {(B, T * n, H)}, got {tuple(beta.shape)}")
    if g is not None and tuple(g.shape) != (B, T, H):
        raise ValueError(f"g: expected {(B, T, H)} (one log gate per token), got {tuple(g.shape)}")
    if cu_seqlens is not None:
        if B != 1:
            raise ValueError(f"cu_seqlens: varlen inputs need batch size 1, got B={B}")
        # (the values are data: not read while torch.compile traces, where reading them would break the graph)
        if cu_seqlens.ndim != 1 or (not torch.compiler.is_compiling() and
                                    (int(cu_seqlens[0]) != 0 or int(cu_seqlens[-1]) != T)):
            raise ValueError(f"cu_seqlens: expected [0, ..., {T}], got {cu_seqlens.tolist()}")
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    if initial_state is not None and tuple(initial_state.shape) != (N, H, K, V):
        raise ValueError(f"initial_state: expected {(N, H, K, V)}, got {tuple(initial_state.shape)}")


def segments(B: int, T: int, cu_seqlens) -> list[tuple[int, int, int]]:
    """(batch index, start, end) of each sequence: one per batch row, or one per cu_seqlens segment."""
    if cu_seqlens is None:
        return [(b, 0, T) for b in range(B)]
    bounds = cu_seqlens.tolist()
    return [(0, bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]


def naive_recurrent_gated_delta_product(
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
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token loop. Returns (o [B, T, H, V] in q's dtype, final state [N, H, K, V] in the compute dtype or None).

    Differentiable by autograd (no in-place updates on tensors that need gradients).
    """
    check_inputs(q, k, v, g, beta, num_householder, initial_state, cu_seqlens)
    n = num_householder
    B, T, H, K = q.shape
    V = v.shape[-1]
    dt, o_dtype = compute_dtype(q, k, v, g, beta, initial_state), q.dtype
    scale = K ** -0.5 if scale is None else scale
    q, k, v, beta = q.to(dt), k.to(dt), v.to(dt), beta.to(dt)
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    k = k.view(B, T, n, H, K)
    v = v.view(B, T, n, H, V)
    beta = beta.view(B, T, n, H)
    g = g.to(dt) if g is not None else None

    outs, finals = [], []
    for i, (b, bos, eos) in enumerate(segments(B, T, cu_seqlens)):
        S = q.new_zeros(H, K, V) if initial_state is None else initial_state[i].to(dt)
        for t in range(bos, eos):
            if g is not None:
                S = S * g[b, t].exp()[:, None, None]
            for j in range(n):
                k_j, v_j, b_j = k[b, t, j], v[b, t, j], beta[b, t, j]  # [H, K], [H, V], [H]
                err = v_j - torch.einsum("hkv,hk->hv", S, k_j)
                S = S + b_j[:, None, None] * k_j[:, :, None] * err[:, None, :]
            outs.append((b, t, scale * torch.einsum("hkv,hk->hv", S, q[b, t])))
        finals.append(S)
    o = torch.stack([x for _, _, x in outs]).view(-1, H, V)
    # rows were produced in (segment, time) order, which is (b, t) order for both layouts
    o = o.view(B, T, H, V).to(o_dtype)
    final = torch.stack(finals) if output_final_state else None
    return o, final



def transition(k: torch.Tensor, g: torch.Tensor | None, beta: torch.Tensor) -> torch.Tensor:
    """The state-transition matrix of one token, exp(g) (I - b_n k_n k_n^T) ... (I - b_1 k_1 k_1^T), in execution
    order (step 1 acts first, so it is the rightmost factor): S_new = A S_old + (writes).
    k [..., n, K] (as used, i.e. already normalised), g [...] log gate or None, beta [..., n] -> A [..., K, K].
    Used by probes (eigenvalues, rotation angles) and the tests."""
    K = k.shape[-1]
    A = torch.eye(K, dtype=k.dtype, device=k.device).expand(*k.shape[:-2], K, K)
    for j in range(k.shape[-2]):
        kj = k[..., j, :]
        A = A - beta[..., j, None, None] * kj[..., :, None] * (kj[..., None, :] @ A)
    return A if g is None else A * g.exp()[..., None, None]


def state_trajectory(k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None, beta: torch.Tensor, *,
                     initial_state: torch.Tensor | None = None, every: str = "token"):
    """Yield the recurrent state [B, H, K, V] after every token (or every Householder sub-step), from the per-token
    internals a dpx.models forward with return_aux=True records: k [B, T, n, H, K] (normalised), v [B, T, n, H, V],
    g [B, T, H] or None, beta [B, T, n, H]. For the effective-rank analysis and state probes (float64-safe loop)."""
    if every not in ("token", "substep"):
        raise ValueError(f"every: expected 'token' or 'substep', got {every!r}")
    B, T, n, H, K = k.shape
    S = k.new_zeros(B, H, K, v.shape[-1]) if initial_state is None else initial_state.to(k.dtype)
    for t in range(T):
        if g is not None:
            S = S * g[:, t].exp().to(S.dtype)[..., None, None]
        for j in range(n):
            kj, vj, bj = k[:, t, j], v[:, t, j].to(S.dtype), beta[:, t, j].to(S.dtype)
            err = vj - torch.einsum("bhkv,bhk->bhv", S, kj)
            S = S + bj[..., None, None] * kj[..., :, None] * err[..., None, :]
            if every == "substep":
                yield S
        if every == "token":
            yield S
