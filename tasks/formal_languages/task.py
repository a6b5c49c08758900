"""The `formal_language` task: train on lengths 3-40, test on 40-256, report scaled accuracy (paper Table 2)."""
from __future__ import annotations

import numpy as np
import torch

from dpx.rundir import SCALED_ACC
from dpx.tasks.context import RunContext
from dpx.tasks.formal_languages.config import FormalLanguageConfig
from dpx.tasks.formal_languages.languages import frame, generate
from dpx.tasks.training import plots
from dpx.tasks.training.loop import fit
from dpx.tasks.training.setup import next_token_loss, setup_trial

EVAL_DATA_SEED = 20250214  # fixed: validation/test samples are shared by all trials
_TRAIN, _VAL, _TEST = 0, 1, 2


def sample_batch(task: FormalLanguageConfig, seed: int, stream: int, index: int, n: int, min_len: int,
                 max_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(inputs, targets, sample lengths) of one batch, a pure function of its arguments."""
    rng = np.random.default_rng([seed, stream, index])
    seq, pos, ans = generate(task.language, rng, n, min_len, max_len, task.modulus, task.brackets_mult)
    x, y = frame(seq, pos, ans)
    lengths = pos + 1 if task.language != "mod_arith_brackets" else pos + 2  # a sample's own token count
    return x, y, lengths


class Scorer:
    """Accuracy over answer positions (argmax over the whole vocabulary), overall and per sample length."""

    def __init__(self):
        self.correct, self.n = 0, 0
        self.by_len: dict[int, list[int]] = {}

    def update(self, logits: torch.Tensor, targets: torch.Tensor, lengths: np.ndarray) -> None:
        mask = targets >= 0
        ok = (logits.argmax(-1) == targets) & mask
        per_sample = ok.sum(1).cpu().numpy()  # exactly one answer position per sample
        self.correct += int(per_sample.sum())
        self.n += int(mask.sum())
        for length, c in zip(lengths.tolist(), per_sample.tolist()):
            s = self.by_len.setdefault(int(length), [0, 0])
            s[0] += c
            s[1] += 1

    @property
    def acc(self) -> float:
        return self.correct / max(self.n, 1)


def scaled(acc: float, chance: float) -> float:
    return (acc - chance) / (1.0 - chance)


def score(model, task: FormalLanguageConfig, stream: int, n: int, batch_size: int, min_len: int, max_len: int,
          device) -> Scorer:
    sc = Scorer()
    for i, start in enumerate(range(0, n, batch_size)):
        x, y, lengths = sample_batch(task, EVAL_DATA_SEED, stream, i, min(batch_size, n - start), min_len, max_len)
        sc.update(model(torch.from_numpy(x).to(device)), torch.from_numpy(y).to(device), lengths)
    return sc


def run(config: dict, ctx: RunContext) -> dict:
    s = setup_trial(config, ctx, FormalLanguageConfig)
    task, train, ev, seed, device, model = s.task, s.train, s.eval, s.seed, s.device, s.model
    micro = train.batch_size // train.grad_accum

    def batch_fn(step: int, m: int):
        x, y, _ = sample_batch(task, seed, _TRAIN, step * train.grad_accum + m, micro, task.train_min_len,
                               task.train_max_len)
        return torch.from_numpy(x), torch.from_numpy(y)

    def eval_fn(m) -> dict:
        sc = score(m, task, _VAL, task.val_samples, ev.batch_size, task.train_min_len, task.train_max_len, device)
        return {"val/acc": sc.acc, "val/scaled_acc": scaled(sc.acc, task.chance)}

    # one answer position per sample; every other label is -1
    result = fit(model, train, ctx, batch_fn=batch_fn, loss_fn=next_token_loss(ignore_index=-1), eval_fn=eval_fn)

    with s.testing(ctx, f"testing on lengths {task.test_min_len}-{task.test_max_len}"):
        sc = score(model, task, _TEST, ev.num_samples, ev.batch_size, task.test_min_len, task.test_max_len, device)
    lens = sorted(sc.by_len)
    accs = [sc.by_len[k][0] / sc.by_len[k][1] for k in lens]
    ctx.log_curve("acc_at_len", lens, accs)
    summary = {
        SCALED_ACC: scaled(sc.acc, task.chance),
        "acc": sc.acc,
        **s.summary(result),
    }
    _plot(ctx, task, lens, accs, summary[SCALED_ACC])
    return summary


def _plot(ctx: RunContext, task: FormalLanguageConfig, lens, accs, scaled_acc: float) -> None:
    plt = plots.pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(lens, accs, ".", ms=3)
    ax.axhline(task.chance, color="gray", ls=":", lw=1, label=f"chance {task.chance:.2f}")
    ax.axvspan(task.train_min_len, task.train_max_len, color="gray", alpha=0.15, label="training lengths")
    ax.set(xlabel="sample length", ylabel="accuracy", ylim=(-0.02, 1.02),
           title=f"{task.language}: scaled accuracy {scaled_acc:.3f}")
    ax.legend(fontsize=7)
    plots.save(ctx, fig, "acc_vs_length")
