"""(slow) train.compile: the trainer runs the DeltaProduct model under torch.compile (inductor, on the CPU here) and
trains to the same losses and validation metrics as eagerly, step for step. On a GPU the chunk kernel is the
custom op dpx::chunk_dp_fwd / chunk_dp_bwd there (tests/test_kernels_compile.py; timed on the H200 in
BENCHMARKS.md, session 8); on the CPU the model takes the PyTorch chunk form, so this checks the loop's side:
the compiled wrapper, its optimizer, checkpoint and evaluation, for both train.compile_scope values (blocks compiled in
place, the default, and the whole model)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dpx.orchestrator.trials import expand
from dpx.tasks import TASKS
from dpx.tasks.context import RunContext

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "fig5_state_tracking.yaml"


def _scalars(run_dir: Path) -> dict:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {(r["key"], r["step"]): r["value"] for r in rows
            if r["key"] in ("train/loss", "train/grad_norm", "val/token_acc", "val/seq_acc")}


@pytest.mark.slow
def test_compiled_training_matches_eager(tmp_path):
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        got = {}
        for name, over in (("eager", ["train.compile=false"]), ("blocks", ["train.compile=true"]),
                           ("model", ["train.compile=true", "train.compile_scope=model"])):
            torch._dynamo.reset()
            t = expand(RECIPE, ["scale=cpu", "train.steps=8", "train.eval_every=4", "train.log_every=4",
                                "eval.num_samples=64", *over]).trials[1]  # n_h = 2
            assert t.config["train"]["compile"] is (name != "eager")
            assert t.config["train"]["compile_scope"] == ("model" if name == "model" else "blocks")
            run_dir = tmp_path / name / t.trial_id
            TASKS[t.config["task"]["name"]].run_fn()(t.config, RunContext(run_dir, t.config))
            got[name] = _scalars(run_dir)
    finally:
        torch.set_num_threads(n)
    eager = got["eager"]
    assert ("train/loss", 8) in eager
    for name in ("blocks", "model"):  # train.compile_scope: each block on its own (default) or the whole model
        compiled = got[name]
        assert eager.keys() == compiled.keys(), (name, sorted(eager), sorted(compiled))
        for key, e in eager.items():
            assert compiled[key] == pytest.approx(e, rel=1e-4, abs=1e-6), (name, key, e, compiled[key])
