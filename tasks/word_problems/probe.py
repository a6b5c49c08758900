"""The paper's Fig. 7 probe (eval.probe: true): did a head learn a rotation?

For every layer and head of a trained delta-rule model, over `eval.probe_samples` validation words:
- beta per group element and Householder step: the mean beta_{t,j} over the positions whose input token is that
  element (Fig. 7 left: two betas near 2 mean two reflections, whose product is a rotation);
- the cumulative explained variance of a PCA of the head's (L2-normalised) keys, all steps pooled (Fig. 7 right:
  three components explaining > 95% mean the reflections act in a 3-D subspace, as S4's rotations of a cube do).
Summary per head: probe/l{l}/h{h}/beta_mean and .../pca3; probe/rotation_heads counts the heads showing both
(n_h >= 2, mean beta > 1.5 and pca3 >= 0.95). Curves: probe/beta/l{l}/h{h}/j{j} over element index, probe/pca_cumvar/l{l}/
h{h} over the number of components. One figure per layer.
"""
from __future__ import annotations

import numpy as np
import torch

from dpx.rundir import CURVE_PROBE_BETA, CURVE_PROBE_PCA, PROBE_HEAD, PROBE_ROTATION_HEADS
from dpx.tasks.training import plots
from dpx.tasks.word_problems.data import WordProblemData


def cumulative_explained_variance(x: np.ndarray) -> np.ndarray:
    """PCA of the rows of x [N, K]: cumulative fraction of the variance explained by the first 1..K components."""
    x = x - x.mean(0, keepdims=True)
    s = np.linalg.svd(x, compute_uv=False) ** 2
    return np.cumsum(s) / max(s.sum(), 1e-30)


def beta_per_element(tokens: np.ndarray, beta: np.ndarray, num_elements: int) -> np.ndarray:
    """tokens [N], beta [N, n] -> [num_elements, n] mean beta per input element (NaN for unseen elements)."""
    out = np.full((num_elements, beta.shape[1]), np.nan)
    for e in range(num_elements):
        sel = tokens == e
        if sel.any():
            out[e] = beta[sel].mean(0)
    return out


@torch.no_grad()
def probe(model, task, ev, ctx, device) -> dict:
    data = WordProblemData(task, 0, 1, 1)
    x, _ = data.eval_set("val", ev.probe_samples)
    model.eval()
    try:
        out = model(torch.from_numpy(x).to(device), return_aux=True)
    except TypeError:
        print("[dpx] probe: this model does not expose its mixer internals (return_aux); probe skipped", flush=True)
        return {}
    tokens = x[:, 1:].reshape(-1)  # position 0 is BOS
    summary: dict[str, float] = {}
    rotation_heads = 0
    for layer, aux in enumerate(out.aux or []):
        if "k" not in aux or "beta" not in aux:
            continue
        k = aux["k"][:, 1:].float().cpu().numpy()  # [B, T, n, H, K]
        beta = aux["beta"][:, 1:].float().cpu().numpy()  # [B, T, n, H]
        n, H, K = k.shape[2], k.shape[3], k.shape[4]
        per_head = []
        for h in range(H):
            b = beta_per_element(tokens, beta[..., h].reshape(-1, n), task.num_elements)
            cv = cumulative_explained_variance(k[:, :, :, h].reshape(-1, K))
            for j in range(n):
                ctx.log_curve(f"{CURVE_PROBE_BETA}/l{layer}/h{h}/j{j}", range(task.num_elements), np.nan_to_num(b[:, j]))
            ctx.log_curve(f"{CURVE_PROBE_PCA}/l{layer}/h{h}", range(1, K + 1), cv)
            bm, p3 = float(np.nanmean(b)), float(cv[min(2, K - 1)])
            summary[f"{PROBE_HEAD}/l{layer}/h{h}/beta_mean"] = bm
            summary[f"{PROBE_HEAD}/l{layer}/h{h}/pca3"] = p3
            rotation_heads += int(n >= 2 and bm > 1.5 and p3 >= 0.95)  # one reflection is no rotation
            per_head.append((b, cv))
        _plot(ctx, task, layer, per_head)
    summary[PROBE_ROTATION_HEADS] = rotation_heads
    return summary


def _plot(ctx, task, layer: int, per_head) -> None:
    plt = plots.pyplot()
    if plt is None:
        return
    H = len(per_head)
    cols = min(H + 1, 5)
    rows = (H + 1 + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.0 * cols, 2.3 * rows), squeeze=False)
    flat = axes.ravel()
    for h, (b, _) in enumerate(per_head):
        ax = flat[h]
        for j in range(b.shape[1]):
            ax.plot(range(task.num_elements), b[:, j], "o-", ms=2.5, lw=0.8, label=f"β step {j + 1}")
        ax.set(ylim=(-0.05, 2.05), title=f"head {h}", xlabel=f"{task.group} element")
        ax.axhline(1, color="gray", lw=0.5, ls=":")
    flat[0].legend(fontsize=6)
    ax = flat[H]
    for h, (_, cv) in enumerate(per_head):
        ax.plot(range(1, len(cv) + 1), cv, lw=1, label=f"h{h}")
    ax.axhline(0.95, color="gray", lw=0.5, ls=":")
    ax.axvline(3, color="gray", lw=0.5, ls=":")
    ax.set(title="keys: PCA cumulative var.", xlabel="components", ylim=(0, 1.02))
    ax.legend(fontsize=5, ncol=2)
    for a in flat[H + 1:]:
        a.axis("off")
    fig.suptitle(f"Fig. 7 probe, layer {layer}", fontsize=9)
    fig.tight_layout()
    plots.save(ctx, fig, f"probe_layer{layer}")
