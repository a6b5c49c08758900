"""The `word_problem` task: train a model on S3/S4/A5/S5 word problems, then measure prefix accuracy at every
position up to the test length (the paper's Fig. 5 / Fig. 12), optionally with the Fig. 7 probe."""
from __future__ import annotations

import numpy as np
import torch

from dpx.rundir import ACC_AT_TRAIN_LEN, CURVE_ACC_AT_POS, MAX_LEN_ACC90, SEQ_ACC, TOKEN_ACC
from dpx.tasks.context import RunContext
from dpx.tasks.training import plots
from dpx.tasks.training.loop import fit
from dpx.tasks.training.setup import next_token_loss, setup_trial
from dpx.tasks.word_problems.config import WordProblemConfig
from dpx.tasks.word_problems.data import WordProblemData
from dpx.tasks.word_problems.metrics import evaluate, max_len_at
from dpx.tasks.word_problems.probe import probe


def run(config: dict, ctx: RunContext) -> dict:
    s = setup_trial(config, ctx, WordProblemConfig)
    task, train, ev, device, model = s.task, s.train, s.eval, s.device, s.model
    data = WordProblemData(task, s.seed, train.batch_size // train.grad_accum, train.grad_accum)
    val_x, val_y = data.eval_set("val", task.val_samples)

    def batch_fn(step: int, micro: int):
        x, y = data.train_batch(step, micro)
        return torch.from_numpy(x), torch.from_numpy(y)

    def eval_fn(m) -> dict:
        acc = evaluate(m, val_x, val_y, ev.batch_size, device)
        return {"val/seq_acc": float(acc.acc_at_pos()[-1]), "val/token_acc": acc.token_acc()}

    # the label at position t is predicted at position t (no shift), BOS included
    result = fit(model, train, ctx, batch_fn=batch_fn, loss_fn=next_token_loss(), eval_fn=eval_fn)

    test_x, test_y = data.eval_set("test", ev.num_samples)
    with s.testing(ctx, f"testing at length {task.test_len}"):
        acc = evaluate(model, test_x, test_y, ev.batch_size, device)
    curve = acc.acc_at_pos()
    positions = np.arange(1, len(curve))
    ctx.log_curve(CURVE_ACC_AT_POS, positions, curve[1:])
    summary = {
        ACC_AT_TRAIN_LEN: float(curve[task.train_len]),
        MAX_LEN_ACC90: max_len_at(curve, 0.9),
        TOKEN_ACC: acc.token_acc(),
        SEQ_ACC: float(curve[-1]),
        **s.summary(result),
    }
    _plot(ctx, task, positions, curve[1:], config)
    if ev.probe:
        summary.update(probe(model, task, ev, ctx, device))
    return summary


def _plot(ctx: RunContext, task: WordProblemConfig, xs, ys, config: dict) -> None:
    plt = plots.pyplot()
    if plt is None:
        return
    m = config["model"]
    label = (f"{m.get('family', 'model')} n_h={m.get('num_householder', 1)} layers={m.get('num_layers', '?')} "
             f"β∈{'[0,2]' if m.get('allow_neg_eigval') else '[0,1]'}")
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(xs, ys, label=label)
    ax.axvline(task.train_len, color="gray", ls="--", lw=1, label=f"train length {task.train_len}")
    ax.axhline(0.9, color="gray", ls=":", lw=1)
    ax.set(xlabel="position t", ylabel="prefix accuracy", ylim=(-0.02, 1.02), xlim=(0, task.test_len),
           title=f"{task.group} word problem")
    ax.legend(fontsize=7, loc="lower left")
    plots.save(ctx, fig, "acc_vs_position")
