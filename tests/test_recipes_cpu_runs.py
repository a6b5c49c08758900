"""(slow) The cpu scale of the experiment recipes added for issue 19 runs end to end: every trial trains and
returns the keys its figure or table is read from. The baselines' word-problem recipe runs a shortened schedule
here (its full cpu scale, 250 steps x 14 architectures, is the run reported in the issue)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dpx.orchestrator.trials import expand
from dpx.tasks import TASKS
from dpx.tasks.context import RunContext

RECIPES = Path(__file__).resolve().parent.parent / "recipes"
CASES = {
    "table5": ([], ("val_ppl", "avg_acc")),
    "fig10_21_scaling": ([], ("val_ppl",)),
    "fig16_18_extrapolation": ([], ("val_ppl",)),
    "fig14_mlp_matching": ([], ("tokens_per_s",)),
    "baselines_lm": ([], ("val_ppl",)),
    "baselines_state_tracking": (["train.steps=6", "train.eval_every=3"], ("acc_at_train_len", "max_len_acc90")),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_cpu_scale_runs(name, tmp_path):
    overrides, want = CASES[name]
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for t in expand(RECIPES / f"{name}.yaml", ["scale=cpu", *overrides]).trials:
            out = TASKS[t.config["task"]["name"]].run_fn()(t.config, RunContext(tmp_path / t.trial_id, t.config))
            missing = [k for k in want if k not in out]
            assert not missing, f"{t.trial_id} {t.config['model'].get('family')}: no {missing} in {sorted(out)}"
    finally:
        torch.set_num_threads(n)
