"""Tasks: what a trial does (train and/or evaluate a model) and how it measures it.

`TASKS[name]` names the task's config class and run function by import path, so importing this package (as the
orchestrator does to validate recipes) loads no torch. A task's `run(config: dict, ctx: RunContext) -> dict`
receives the whole resolved trial config and returns its summary metrics.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class TaskSpec:
    name: str
    config: str  # "module:Class", a torch-free stdlib dataclass
    run: str  # "module:function"
    doc: str = ""

    def config_cls(self) -> type:
        return _load(self.config)

    def run_fn(self) -> Callable[[dict, Any], dict]:
        return _load(self.run)


def _load(path: str) -> Any:
    mod, _, attr = path.partition(":")
    return getattr(importlib.import_module(mod), attr)


TASKS: dict[str, TaskSpec] = {}


def register(name: str, config: str, run: str, doc: str = "") -> None:
    TASKS[name] = TaskSpec(name, config, run, doc)


# Orchestration self-test task: sleeps, logs, fails or diverges on request. Used by tests and benchmarks.
register("debug", "dpx.tasks.debug.config:DebugConfig", "dpx.tasks.debug.task:run",
         "no model: sleep, log metrics, optionally fail / exit / diverge / hang (for tests and benchmarks)")
# Tasks register below, one line each.
register("word_problem", "dpx.tasks.word_problems.config:WordProblemConfig", "dpx.tasks.word_problems.task:run",
         "group word problems S3/S4/A5/S5: prefix accuracy at every position (paper Fig. 5, 7, 12)")
register("formal_language", "dpx.tasks.formal_languages.config:FormalLanguageConfig",
         "dpx.tasks.formal_languages.task:run",
         "parity, modular arithmetic without/with brackets: scaled accuracy on longer samples (paper Table 2)")
register("lm", "dpx.tasks.lm.config:LMConfig", "dpx.tasks.lm.task:run",
         "language modelling (paper protocol) on a hub / local / shipped corpus, then optional evals (Tables 3-4)")
register("lm_eval", "dpx.tasks.lm.config:LMEvalConfig", "dpx.tasks.lm.task:run",
         "lm-evaluation-harness zero-shot: wikitext, lambada, piqa, hellaswag, winogrande, arc-e/c (Tables 3-4)")
register("extrapolation", "dpx.tasks.lm.config:ExtrapolationConfig", "dpx.tasks.lm.task:run",
         "per-position loss up to 32K tokens, 501-token moving average (Fig. 8)")
register("effective_rank", "dpx.tasks.lm.config:EffectiveRankConfig", "dpx.tasks.lm.task:run",
         "effective rank of every head's state along a sequence, batched SVD on the device (Fig. 9)")
register("throughput", "dpx.tasks.lm.config:ThroughputConfig", "dpx.tasks.lm.throughput:run",
         "training tokens/s at (seq len x batch), ours or fla's GatedDeltaProduct layer (Fig. 4)")
