"""What every training task does first and last, in one place: read its sections of the trial config into their
typed classes, cross-check the task against the model, build the seeded model; at the end, evaluate under
no_grad/autocast and report the summary keys every training task shares.

    s = setup_trial(config, ctx, WordProblemConfig)          # s.task, s.train, s.eval, s.seed, s.device, s.model
    result = fit(s.model, s.train, ctx, batch_fn=..., loss_fn=next_token_loss(), eval_fn=...)
    with s.testing(ctx, "testing at length 512"):             # model.eval(), no_grad, the training precision
        ...
    return {**task_metrics, **s.summary(result)}

A task that resolves `train:` itself or builds its model later (the LM task: tokens_per_step -> batch_size, the
model after the data is opened) passes `train=` a callable of the task config and `build=False`, then calls
`s.build_model()` when it is ready.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from dpx.models import num_params
from dpx.rundir import NUM_PARAMS, TOKENS_PER_S
from dpx.tasks.context import RunContext
from dpx.tasks.training.config import EvalConfig, TrainConfig
from dpx.tasks.training.loop import FitResult, autocast
from dpx.tasks.training.model import build_seeded_model


@dataclass
class TrialSetup:
    config: dict
    """the whole resolved trial config"""
    task: Any
    """the task section as the task's config class"""
    train: TrainConfig
    eval: EvalConfig
    seed: int
    device: torch.device
    model: nn.Module | None = None
    """built (seeded by the trial seed) unless setup_trial(build=False)"""

    def build_model(self) -> nn.Module:
        self.model = build_seeded_model(self.config["model"], self.seed)
        return self.model

    @contextlib.contextmanager
    def testing(self, ctx: RunContext, message: str) -> Iterator[nn.Module]:
        """The final evaluation: progress 1.0 with `message`, eval mode, no gradients, the training precision."""
        ctx.report_progress(1.0, message)
        self.model.eval()
        with torch.no_grad(), autocast(self.device, self.train.precision):
            yield self.model

    def summary(self, result: FitResult) -> dict:
        """The keys every training task reports (dpx.rundir): throughput, size, last validation, train/*."""
        return {TOKENS_PER_S: round(result.tokens_per_s, 1), NUM_PARAMS: num_params(self.model),
                **result.last_eval, **result.summary()}


def setup_trial(config: dict, ctx: RunContext, task_cls: type, *,
                train: Callable[[Any], TrainConfig] | None = None, build: bool = True) -> TrialSetup:
    """Typed sections of a training trial, checked against each other, and its seeded model.

    Raises the config classes' ValueError("key: reason") before any data or model work, so a bad trial fails in
    a line. `train`, when given, turns the task config into the TrainConfig (tasks that derive batch sizes)."""
    task = config["task"] if isinstance(config["task"], task_cls) else task_cls(**config["task"])
    tc = train(task) if train is not None else TrainConfig(**(config.get("train") or {}))
    ev = EvalConfig(**(config.get("eval") or {}))
    check = getattr(task, "check_model", None)
    if check is not None and config.get("model") is not None:
        check(config["model"])
    s = TrialSetup(config, task, tc, ev, int(config.get("seed", 0)), ctx.device)
    if build:
        s.build_model()
    return s


def next_token_loss(ignore_index: int = -100) -> Callable[[nn.Module, tuple], tuple[torch.Tensor, int]]:
    """loss_fn for `fit`: cross-entropy of the logits at every position against the labels (in float32), and the
    batch's token count for tokens/s. Labels equal to `ignore_index` do not count."""

    def loss_fn(model: nn.Module, batch: tuple) -> tuple[torch.Tensor, int]:
        x, y = batch
        logits = model(x)
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=ignore_index), x.numel()

    return loss_fn
