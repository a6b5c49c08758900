"""The shared task set-up helper (tasks/training/setup.py): typed sections, task/model cross-check before any
model work, the seeded model, the shared loss against a float64 reference (gradients too), the test phase and
the summary keys."""
from __future__ import annotations

import json

import pytest
import torch

from dpx.tasks.context import RunContext
from dpx.tasks.formal_languages.config import FormalLanguageConfig
from dpx.tasks.training.config import EvalConfig, TrainConfig
from dpx.tasks.training.loop import FitResult
from dpx.tasks.training.setup import next_token_loss, setup_trial
from dpx.tasks.word_problems.config import WordProblemConfig

MODEL = {"family": "deltaproduct", "num_layers": 1, "hidden_size": 16, "num_heads": 2, "vocab_size": 13,
         "num_householder": 2}


def trial(**over) -> dict:
    cfg = {"seed": 3, "model": dict(MODEL), "task": {"name": "word_problem", "group": "S3", "train_len": 8,
                                                      "test_len": 12},
           "train": {"steps": 5, "batch_size": 4, "grad_accum": 2}, "eval": {"batch_size": 8}}
    cfg.update(over)
    return cfg


@pytest.fixture
def ctx(tmp_path):
    c = RunContext(tmp_path / "run", {}, device="cpu")
    yield c
    c.close()


def test_sections_typed_and_model_seeded(ctx):
    from dpx.models import build_model

    s = setup_trial(trial(), ctx, WordProblemConfig)
    assert isinstance(s.task, WordProblemConfig) and s.task.train_len == 8
    assert s.train == TrainConfig(steps=5, batch_size=4, grad_accum=2) and s.eval == EvalConfig(batch_size=8)
    assert s.seed == 3 and s.device == torch.device("cpu")
    torch.manual_seed(3)
    ref = build_model(dict(MODEL)).state_dict()
    got = s.model.state_dict()
    assert ref.keys() == got.keys() and all(torch.equal(ref[k], got[k]) for k in ref)  # the trial seed's weights
    other = setup_trial(trial(seed=4), ctx, WordProblemConfig).model.state_dict()
    assert any(not torch.equal(other[k], got[k]) for k in got)


BOGUS = {**MODEL, "family": "no_such_family"}  # building it would fail with another message


@pytest.mark.parametrize("over, words", [
    ({"train": {"steps": 0}, "model": BOGUS}, "steps: must be >= 1"),
    ({"eval": {"batch_size": 0}, "model": BOGUS}, "batch_size: must be >= 1"),
    ({"task": {"name": "word_problem", "group": "S7"}, "model": BOGUS}, "group: unknown group"),
    ({"model": {**MODEL, "vocab_size": 7}}, "model.vocab_size: 7 cannot hold"),
])
def test_bad_sections_fail_in_one_line_before_the_model(ctx, over, words):
    with pytest.raises(ValueError, match=words.replace(".", r"\.")):
        setup_trial(trial(**over), ctx, WordProblemConfig)


def test_bogus_model_fails_when_built(ctx):
    with pytest.raises(Exception, match="no_such_family"):
        setup_trial(trial(model=BOGUS), ctx, WordProblemConfig)
    assert setup_trial(trial(model=BOGUS), ctx, WordProblemConfig, build=False).model is None


def test_derived_train_and_late_model(ctx):
    """The LM task's way: train: derived from the task config, the model built later."""
    cfg = trial(task={"name": "formal_language", "language": "parity"}, train={"steps": 2})
    seen = []

    def derive(task):
        seen.append(task)
        return TrainConfig(steps=7, batch_size=6, grad_accum=3)

    s = setup_trial(cfg, ctx, FormalLanguageConfig, train=derive, build=False)
    assert seen == [s.task] and isinstance(s.task, FormalLanguageConfig)
    assert s.train.batch_size == 6 and s.model is None
    m = s.build_model()
    assert s.model is m and sum(p.numel() for p in m.parameters()) > 0
    assert setup_trial(cfg, ctx, FormalLanguageConfig, train=derive, build=False).task == s.task
    typed = setup_trial({**cfg, "task": s.task}, ctx, FormalLanguageConfig, build=False)  # an instance passes
    assert typed.task is s.task


@pytest.mark.parametrize("ignore_index", [-100, -1])
def test_next_token_loss_against_float64(ignore_index):
    g = torch.Generator().manual_seed(0)
    B, T, V = 3, 5, 7
    w = torch.randn(V, V, generator=g, requires_grad=True)
    x = torch.randint(0, V, (B, T), generator=g)
    y = torch.randint(0, V, (B, T), generator=g)
    y[0, :2] = ignore_index
    y[2, 4] = ignore_index

    def model(ids):
        return w[ids].to(torch.bfloat16)  # low-precision logits: the loss must still be taken in float32

    loss, n = next_token_loss(ignore_index)(model, (x, y))
    assert n == B * T and loss.dtype == torch.float32
    loss.backward()
    got_grad = w.grad.clone()

    w64 = w.detach().to(torch.bfloat16).double().requires_grad_(True)
    logp = torch.log_softmax(w64[x], -1)
    keep = y != ignore_index
    ref = -(logp[keep].gather(-1, y[keep][:, None]).squeeze(-1)).sum() / keep.sum()
    ref.backward()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    torch.testing.assert_close(got_grad.double(), w64.grad, rtol=2e-2, atol=1e-3)  # through the bf16 cast


def test_testing_phase_and_summary(ctx):
    s = setup_trial(trial(), ctx, WordProblemConfig)
    s.model.train()
    with s.testing(ctx, "testing at length 12") as m:
        assert m is s.model and not m.training and not torch.is_grad_enabled()
    assert torch.is_grad_enabled()
    prog = json.loads((ctx.run_dir / "progress.json").read_text())
    assert prog["fraction"] == 1.0 and prog["message"] == "testing at length 12"
    res = FitResult(step=5, stop_reason="steps", train_time_s=2.0, tokens=400, tokens_per_s=200.04,
                    last_eval={"val/seq_acc": 0.5})
    out = s.summary(res)
    assert out["tokens_per_s"] == 200.0 and out["val/seq_acc"] == 0.5 and out["train/steps"] == 5
    assert out["num_params"] == sum(p.numel() for p in s.model.parameters())


def test_task_configs_load_without_torch_or_pydantic():
    """`import dpx.tasks` and every task's config class (the orchestrator's recipe check, the runner on a bare node)
    load neither torch nor pydantic; a bad choice is one line from the stdlib check alone."""
    import subprocess
    import sys

    code = ("import sys, dpx.tasks\n"
            "for spec in dpx.tasks.TASKS.values(): spec.config_cls()()\n"
            "from dpx.tasks.word_problems.config import WordProblemConfig\n"
            "try: WordProblemConfig(group='S44')\n"
            "except ValueError as e: assert str(e).startswith(\"group: unknown group 'S44' (did you mean 'S4'?)\"), e\n"
            "bad = [m for m in ('torch', 'pydantic', 'numpy') if m in sys.modules]\n"
            "assert not bad, bad\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
