"""The shared training loop: schedule, exact resume after preemption, SIGTERM, divergence, early stop, logging."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from dpx.tasks.context import Diverged, Preempted, RunContext
from dpx.tasks.training.config import TrainConfig
from dpx.tasks.training.loop import fit
from dpx.tasks.training.schedule import lr_factor

VOCAB, T = 7, 6


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny models on a shared 2-core box


class TinyRNN(nn.Module):
    """Test double of a dpx model: input ids [B, T] -> logits [B, T, V]; dropout exercises the RNG state."""

    def __init__(self, vocab=VOCAB, d=16, dropout=0.1):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = nn.GRU(d, d, batch_first=True)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(d, vocab)

    def forward(self, x):
        h, _ = self.rnn(self.drop(self.emb(x)))
        return self.head(h)


def batch_fn(step, micro):
    g = torch.Generator().manual_seed(1000 * step + micro)
    x = torch.randint(0, VOCAB, (8, T), generator=g)
    return x, (x + torch.roll(x, 1, 1)) % VOCAB  # previous + current token: needs one step of memory


def loss_fn(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()), x.numel()


def read_metrics(run_dir):
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def new_model():
    torch.manual_seed(0)
    return TinyRNN()


CFG = dict(steps=12, batch_size=8, grad_accum=2, lr=3e-3, warmup_steps=3, log_every=2, eval_every=0,
           checkpoint_every=0, precision="fp32")


def test_lr_schedule_matches_formula():
    kw = dict(steps=110, warmup_steps=10, schedule="cosine", min_lr_ratio=0.1)
    assert lr_factor(0, **kw) == pytest.approx(0.1)
    assert lr_factor(9, **kw) == pytest.approx(1.0)
    for s in (10, 35, 60, 85, 109):
        p = (s - 10) / 100
        assert lr_factor(s, **kw) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))
    assert lr_factor(60, **{**kw, "schedule": "linear"}) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_factor(60, **{**kw, "schedule": "constant"}) == 1.0


def test_logged_lr_follows_schedule_and_throughput_is_logged(tmp_path):
    ctx = RunContext(tmp_path, {})
    cfg = TrainConfig(**{**CFG, "log_every": 1})
    fit(new_model(), cfg, ctx, batch_fn=batch_fn, loss_fn=loss_fn)
    rows = read_metrics(tmp_path)
    lrs = {r["step"]: r["value"] for r in rows if r["key"] == "train/lr"}
    for step, lr in lrs.items():  # the lr logged at step s was used for update s-1 (0-based)
        assert lr == pytest.approx(cfg.lr * lr_factor(step - 1, steps=12, warmup_steps=3, schedule="cosine",
                                                      min_lr_ratio=0.1))
    tps = [r["value"] for r in rows if r["key"] == "train/tokens_per_s"]
    assert len(tps) == 12 and all(v > 0 for v in tps)
    assert json.loads((tmp_path / "progress.json").read_text())["fraction"] == 1.0


def test_preempt_then_resume_is_bit_identical(tmp_path):
    ref_model = new_model()
    ref = fit(ref_model, TrainConfig(**CFG), RunContext(tmp_path / "ref", {}), batch_fn=batch_fn, loss_fn=loss_fn)

    ctx = RunContext(tmp_path / "cut", {})

    def stopping_batch_fn(step, micro):
        if step == 5 and micro == 1:
            ctx.request_stop()  # like SIGTERM arriving during step 5
        return batch_fn(step, micro)

    with pytest.raises(Preempted, match="step 6"):
        fit(new_model(), TrainConfig(**CFG), ctx, batch_fn=stopping_batch_fn, loss_fn=loss_fn)
    assert (ctx.checkpoint_dir / "last.pt").exists()
    assert torch.load(ctx.checkpoint_dir / "last.pt", weights_only=False)["step"] == 6

    model2 = new_model()
    torch.manual_seed(123)  # a fresh process would have some other RNG state: the checkpoint must restore it
    res = fit(model2, TrainConfig(**CFG), RunContext(tmp_path / "cut", {}, attempt=2), batch_fn=batch_fn,
              loss_fn=loss_fn)
    assert res.resumed_from == 6 and res.step == 12 and ref.step == 12
    for (n, a), b in zip(ref_model.state_dict().items(), model2.state_dict().values()):
        assert torch.equal(a, b), n
    assert res.tokens == ref.tokens


def test_tokens_per_s_leaves_out_each_attempts_first_step(tmp_path):
    # a first step that is slow (on a GPU: compilation and autotuning) must not set the reported rate
    ctx = RunContext(tmp_path / "run", {})
    slow = {0: 0.6, 6: 0.6}  # the first step of each attempt

    def bf(step, micro):
        if micro == 0 and step in slow:
            time.sleep(slow[step])
        if step == 5 and micro == 1:
            ctx.request_stop()
        return batch_fn(step, micro)

    with pytest.raises(Preempted):
        fit(new_model(), TrainConfig(**CFG), ctx, batch_fn=bf, loss_fn=loss_fn)
    res = fit(new_model(), TrainConfig(**CFG), RunContext(tmp_path / "run", {}, attempt=2), batch_fn=bf,
              loss_fn=loss_fn)
    assert res.step == 12 and res.first_steps_s >= 1.2
    assert res.tokens_per_s_overall == pytest.approx(res.tokens / res.train_time_s)
    steady = (res.tokens - 2 * 2 * 8 * T) / (res.train_time_s - res.first_steps_s)  # 2 micro-batches of 8 x T a step
    assert res.tokens_per_s == pytest.approx(steady) and res.tokens_per_s > res.tokens_per_s_overall
    summary = res.summary()
    assert summary["train/first_steps_s"] >= 1.2 and summary["train/tokens_per_s"] > summary["train/tokens_per_s_overall"]


def test_time_box_leaves_out_the_first_step(tmp_path):
    # a first step longer than the whole box (a GPU's compile + autotune) still leaves the box for training
    def bf(step, micro):
        if step == 0 and micro == 0:
            time.sleep(0.5)
        if step >= 2 and micro == 0:
            time.sleep(0.05)
        return batch_fn(step, micro)
    res = fit(new_model(), TrainConfig(**{**CFG, "steps": 1000, "max_time_s": 0.3}), RunContext(tmp_path, {}),
              batch_fn=bf, loss_fn=loss_fn)
    assert res.stop_reason == "time_limit" and res.first_steps_s >= 0.5
    assert 3 <= res.step < 1000 and res.train_time_s - res.first_steps_s >= 0.3


def test_periodic_checkpoint_and_finished_run_is_not_retrained(tmp_path):
    cfg = TrainConfig(**{**CFG, "checkpoint_every": 4})
    calls = []
    fit(new_model(), cfg, RunContext(tmp_path, {}), batch_fn=lambda s, m: calls.append(s) or batch_fn(s, m),
        loss_fn=loss_fn)
    ck = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=False)
    assert ck["finished"] and ck["step"] == 12
    calls.clear()
    res = fit(new_model(), cfg, RunContext(tmp_path, {}, attempt=2), batch_fn=batch_fn, loss_fn=loss_fn)
    assert res.step == 12 and res.resumed_from == 12 and not calls


def test_nan_loss_raises_diverged_naming_the_step(tmp_path):
    def bf(step, micro):
        x, y = batch_fn(step, micro)
        if step == 3:
            x = x.clone()
            x[0, 0] = -1  # marker, removed again by loss_marked before embedding
        return x, y

    def loss_marked(model, batch):
        x, y = batch
        loss, n = loss_fn(model, (x.clamp(min=0), y))
        return (loss * float("nan") if x[0, 0] == -1 else loss), n

    with pytest.raises(Diverged, match=r"loss is nan at step 4"):
        fit(new_model(), TrainConfig(**CFG), RunContext(tmp_path, {}), batch_fn=bf, loss_fn=loss_marked)
    rows = [r for r in read_metrics(tmp_path) if r["key"] == "train/loss" and r["step"] == 4]
    assert rows and rows[-1]["value"] is None  # logged as null


def test_early_stop_on_validation_metric(tmp_path):
    seen = []

    def eval_fn(model):
        seen.append(1)
        return {"val/score": len(seen) / 4}

    cfg = TrainConfig(**{**CFG, "eval_every": 2, "early_stop_metric": "val/score", "early_stop_value": 0.75})
    res = fit(new_model(), cfg, RunContext(tmp_path, {}), batch_fn=batch_fn, loss_fn=loss_fn, eval_fn=eval_fn)
    assert res.stop_reason == "early_stop" and res.step == 6 and res.last_eval == {"val/score": 0.75}
    vals = [(r["step"], r["value"]) for r in read_metrics(tmp_path) if r["key"] == "val/score"]
    assert vals == [(2, 0.25), (4, 0.5), (6, 0.75)]
    with pytest.raises(KeyError, match="early_stop_metric"):
        fit(new_model(), dataclasses.replace(cfg, early_stop_metric="val/nope"), RunContext(tmp_path / "b", {}),
            batch_fn=batch_fn, loss_fn=loss_fn, eval_fn=eval_fn)


def test_training_reduces_loss(tmp_path):
    cfg = TrainConfig(**{**CFG, "steps": 60, "log_every": 10, "lr": 3e-2})
    copy_task = lambda s, m: (batch_fn(s, m)[0],) * 2  # noqa: E731  (y = x: learnable in a few dozen steps)
    fit(new_model(), cfg, RunContext(tmp_path, {}), batch_fn=copy_task, loss_fn=loss_fn)
    losses = [r["value"] for r in read_metrics(tmp_path) if r["key"] == "train/loss"]
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.parametrize("bad", [dict(steps=0), dict(grad_accum=3), dict(schedule="step"), dict(lr=0),
                                 dict(precision="fp16"), dict(early_stop_mode="up"), dict(min_lr_ratio=2.0)])
def test_bad_train_config(bad):
    key = next(iter(bad))
    with pytest.raises(ValueError, match=rf"^{key}: "):
        TrainConfig(**bad)


SIGTERM_SCRIPT = textwrap.dedent("""
    import sys, time, torch
    sys.path.insert(0, {tests!r})
    from test_tasks_synthetic_training import TinyRNN, batch_fn, loss_fn, CFG
    from dpx.tasks.context import RunContext, Preempted
    from dpx.tasks.training.config import TrainConfig
    from dpx.tasks.training.loop import fit
    ctx = RunContext({run_dir!r}, {{}})
    ctx.install_signal_handlers()
    def slow(step, micro):
        time.sleep(0.05)
        return batch_fn(step, micro)
    torch.manual_seed(0)
    try:
        fit(TinyRNN(), TrainConfig(**{{**CFG, "steps": 10000, "log_every": 1}}), ctx, batch_fn=slow, loss_fn=loss_fn)
    except Preempted as e:
        print("PREEMPTED", e, flush=True)
        sys.exit(3)
""")


def test_sigterm_checkpoints_and_raises_preempted(tmp_path):
    run_dir = tmp_path / "run"
    script = SIGTERM_SCRIPT.format(tests=str(Path(__file__).parent), run_dir=str(run_dir))
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 60
        while not (run_dir / "progress.json").exists() and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(0.3)
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 3, out
    assert "PREEMPTED" in out
    ck = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=False)
    assert 0 < ck["step"] < 10000 and not ck["finished"]
