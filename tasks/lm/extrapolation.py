"""Length extrapolation (Fig. 8; appendix to 32,768 tokens): next-token loss at every position of long sequences.

The authors' protocol (custom_evals/length_extrapolation.py): tokenise the validation documents with <s>,
concatenate, cut into non-overlapping chunks of max_len tokens; for each chunk src = chunk[:-1], tgt = chunk[1:],
loss[t] = CE(logits[t], tgt[t]) without reduction; the curve is the mean over chunks at each position. Model
weights stay fp32 under bf16 autocast. The plot smooths with a 501-token moving average (the paper's figure);
the raw curve goes to metrics.jsonl as `loss_at_pos/<dataset>` (step = tokens of context seen, 1..max_len-1).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from dpx.rundir import CURVE_LOSS_AT_POS, LOSS_BEYOND_CTX, LOSS_IN_CTX
from dpx.tasks.training import plots
from dpx.tasks.training.loop import autocast

from .config import ExtrapolationOptions
from .packing import take_sequences
from .sources import open_source


def moving_average(x: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Centred moving average over complete windows: (positions, values); positions are 1-based."""
    x = np.asarray(x, dtype=np.float64)
    w = min(window, len(x))
    ys = np.convolve(x, np.ones(w) / w, mode="valid")
    xs = np.arange(len(ys)) + (w - 1) / 2 + 1
    return xs, ys


@torch.no_grad()
def per_position_loss(model, seqs: torch.Tensor, batch_size: int, device) -> np.ndarray:
    """[N, L] token ids -> mean over the N sequences of the loss at each of the L-1 positions (float64)."""
    total = torch.zeros(seqs.shape[1] - 1, dtype=torch.float64, device=device)
    for i in range(0, len(seqs), batch_size):
        b = seqs[i:i + batch_size].to(device)
        with autocast(device):
            logits = model(b[:, :-1])
        loss = F.cross_entropy(logits.float().transpose(1, 2), b[:, 1:], reduction="none")  # [B, L-1]
        total += loss.double().sum(0)
        del logits, loss
    return (total / len(seqs)).cpu().numpy()


def load_sequences(dataset: str, data_files: list[str], tok, max_len: int, n: int, seed: int) -> np.ndarray:
    """n chunks of max_len tokens from the validation split (the authors': a 0.0005 split, seed 2357), topped up
    from the training split when a small offline corpus has too little held-out text."""
    kw = dict(data_files=data_files, seed=seed, val_fraction=0.0005, val_seed=2357)
    seqs = take_sequences(open_source(dataset, "validation", **kw), tok, max_len, n)
    if len(seqs) < n:
        more = take_sequences(open_source(dataset, "train", **kw), tok, max_len, n - len(seqs))
        print(f"[dpx] extrapolation: {dataset} validation split has {len(seqs)} chunks of {max_len}; "
              f"{len(more)} more from its training split", flush=True)
        seqs = np.concatenate([seqs, more]) if len(seqs) else more
    if len(seqs) == 0:
        raise ValueError(f"task.extrapolation.max_len: {dataset} has fewer than {max_len} tokens")
    return seqs


def evaluate(model, tok, opts: ExtrapolationOptions, ctx, train_context: int, seed: int = 0) -> dict:
    device = ctx.device
    model.eval()
    curves, out = {}, {}
    for ds in opts.datasets:
        seqs = load_sequences(ds, list(opts.data_files.get(ds, [])), tok, opts.max_len, opts.num_sequences, seed)
        loss = per_position_loss(model, torch.from_numpy(seqs.astype(np.int64)), opts.batch_size, device)
        pos = np.arange(1, len(loss) + 1)
        ctx.log_curve(f"{CURVE_LOSS_AT_POS}/{ds}", pos.tolist(), loss.tolist())
        curves[ds] = loss
        inside = loss[:min(train_context, len(loss))]
        out[f"{LOSS_IN_CTX}/{ds}"] = float(inside.mean())
        if len(loss) > train_context:
            out[f"{LOSS_BEYOND_CTX}/{ds}"] = float(loss[train_context:].mean())
        out[f"loss_at_max_len/{ds}"] = float(moving_average(loss, opts.window)[1][-1])
    if len(opts.datasets) == 1:  # the registry's plain keys when there is no ambiguity
        ds = opts.datasets[0]
        out[LOSS_IN_CTX] = out[f"{LOSS_IN_CTX}/{ds}"]
        if f"{LOSS_BEYOND_CTX}/{ds}" in out:
            out[LOSS_BEYOND_CTX] = out[f"{LOSS_BEYOND_CTX}/{ds}"]
    m = getattr(model, "config", None)
    label = (f"{m.family} n_h={m.num_householder} H={m.num_heads} d_k={m.key_dim}" if m is not None else "model")
    plot(curves, opts.window, train_context, ctx, label=label)
    return out


def plot(curves: dict[str, np.ndarray], window: int, train_context: int, ctx, label: str = "model"):
    plt = plots.pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, len(curves), figsize=(4.5 * len(curves), 3.4), squeeze=False)
    for ax, (ds, loss) in zip(axes[0], curves.items()):
        xs, ys = moving_average(loss, window)
        ax.plot(xs, ys, label=label)
        ax.axvline(train_context, color="k", ls="--", lw=0.8)
        ax.set_title(ds)
        ax.set_xlabel("position")
        ax.set_ylabel(f"loss ({min(window, len(loss))}-token moving average)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    plots.save(ctx, fig, "extrapolation")
