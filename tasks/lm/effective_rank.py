"""Effective rank of every head's state along a sequence (Fig. 9).

    erank(S) = exp(-sum_i p_i log p_i),  p = sigma / sum(sigma),  sigma = singular values of S above eps
    (Roy & Vetterli; 0 for the zero state)

The authors hook q, k, v, beta (and g) of each layer, then replay the delta rule in fp32 from a zero state and take
one CPU SVD per head and sub-step. Here the model records the same per-token internals (`return_aux=True`: keys
already SiLU'd and L2-normalised, values, beta in [0, 2], log-space gates), the replay runs on the model's device
for all chosen layers and heads at once, and the singular values of a whole block of states come from one batched
`torch.linalg.svdvals` call. The state is recorded after each token's n_h Householder steps, which is the authors'
sub-step curve sampled at token boundaries.
"""
from __future__ import annotations

import numpy as np
import torch

from dpx.rundir import CURVE_ERANK
from dpx.tasks.training import plots

from .config import EffectiveRankOptions
from .extrapolation import load_sequences


def erank_from_svals(s: torch.Tensor) -> torch.Tensor:
    """[..., r] singular values -> [...] effective rank (0 where every value is ~0)."""
    s = s.double()
    eps = torch.finfo(torch.float64).eps
    s = torch.where(s > eps, s, torch.zeros_like(s))
    tot = s.sum(-1, keepdim=True)
    p = s / tot.clamp_min(eps)
    ent = -(torch.where(p > 0, p * torch.log(p.clamp_min(1e-300)), torch.zeros_like(p))).sum(-1)
    return torch.where(tot[..., 0] > 0, torch.exp(ent), torch.zeros_like(ent))


@torch.no_grad()
def state_eranks(k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, g: torch.Tensor | None = None, *,
                 stride: int = 1, max_block_elems: int = 2 ** 26) -> torch.Tensor:
    """Replay S <- exp(g_t) S; for j < n_h: S <- S + beta_j k_j (v_j - S^T k_j)^T from S = 0, per head.

    k [T, n, H, K] (unit norm), v [T, n, H, V], beta [T, n, H], g [T, H] or None (log space).
    Returns [T // stride, H] effective ranks of the state after tokens stride-1, 2*stride-1, ... (fp32 replay,
    float64 entropy)."""
    T, n, H, K = k.shape
    V = v.shape[-1]
    k, v, beta = k.float(), v.float(), beta.float()
    S = torch.zeros(H, K, V, device=k.device)
    block = max(1, max_block_elems // (H * K * V))
    pending, out = [], []
    for t in range(T):
        if g is not None:
            S = S * g[t].float().exp()[:, None, None]
        for j in range(n):
            kj = k[t, j]  # [H, K]
            err = v[t, j] - torch.einsum("hk,hkv->hv", kj, S)
            S = S + kj[:, :, None] * (beta[t, j][:, None] * err)[:, None, :]
        if (t + 1) % stride == 0:
            pending.append(S)
            if len(pending) == block:
                out.append(erank_from_svals(torch.linalg.svdvals(torch.stack(pending))))
                pending = []
    if pending:
        out.append(erank_from_svals(torch.linalg.svdvals(torch.stack(pending))))
    return torch.cat(out).float() if out else torch.zeros(0, H)


def evaluate(model, tok, opts: EffectiveRankOptions, ctx, train_context: int, seed: int = 0) -> dict:
    device = ctx.device
    seqs = load_sequences(opts.dataset, list(opts.data_files), tok, opts.seq_len, 1, seed)
    ids = torch.from_numpy(seqs[:1].astype(np.int64)).to(device)
    model.eval()
    with torch.no_grad():
        out = model(ids, return_aux=True)
    aux = out.aux
    L = len(aux)
    layers = [l % L for l in opts.layers] if opts.layers else list(range(L))
    if not all(("k" in aux[l] and "v" in aux[l] and "beta" in aux[l]) for l in layers):
        fam = ctx.config.get("model", {}).get("family")
        raise ValueError(f"task.evals: effective_rank replays the delta rule; family {fam!r} records no k/v/beta")
    bos = np.nonzero(seqs[0] == tok.bos_id)[0]
    positions = np.arange(opts.stride, seqs.shape[1] + 1, opts.stride)
    summary, curves = {}, {}
    for l in layers:
        a = aux[l]
        g = a.get("g")
        er = state_eranks(a["k"][0], a["v"][0], a["beta"][0], None if g is None else g[0],
                          stride=opts.stride).cpu().numpy()  # [T', H]
        heads = [h % er.shape[1] for h in opts.heads] if opts.heads else list(range(er.shape[1]))
        for h in heads:
            ctx.log_curve(f"{CURVE_ERANK}/l{l}/h{h}", positions.tolist(), er[:, h].tolist())
            curves[(l, h)] = er[:, h]
        inside = er[positions <= train_context]
        summary[f"erank_in_ctx/l{l}"] = float(inside.mean()) if len(inside) else float("nan")
        beyond = er[positions > train_context]
        if len(beyond):
            summary[f"erank_beyond_ctx/l{l}"] = float(beyond.mean())
    plot(curves, positions, bos, train_context, ctx)
    return summary


def plot(curves: dict, positions: np.ndarray, bos: np.ndarray, train_context: int, ctx) -> None:
    plt = plots.pyplot()
    if plt is None:
        return
    layers = sorted({l for l, _ in curves})
    fig, axes = plt.subplots(len(layers), 1, figsize=(7, 2.6 * len(layers)), squeeze=False)
    for ax, l in zip(axes[:, 0], layers):
        for b in bos[:200]:  # new documents (thin lines), as in the paper
            ax.axvline(b + 1, color="0.85", lw=0.4)
        for (ll, h), y in sorted(curves.items()):
            if ll == l:
                ax.plot(positions, y, lw=0.9, label=f"head {h}")
        if train_context < positions[-1]:
            ax.axvline(train_context, color="k", ls="--", lw=0.8)
        ax.set_title(f"layer {l}")
        ax.set_ylabel("effective rank")
        ax.legend(fontsize=7, ncol=4)
    axes[-1, 0].set_xlabel("position")
    fig.tight_layout()
    plots.save(ctx, fig, "effective_rank")
