"""The LM recipes expand and validate at every scale, and parameter matching lands on the paper's models."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("omegaconf")
from dpx.models.config import ModelConfig  # noqa: E402
from dpx.models.matching import solve  # noqa: E402
from dpx.orchestrator.load import read_recipe  # noqa: E402
from dpx.orchestrator.trials import expand  # noqa: E402

RECIPES = Path(__file__).resolve().parent.parent / "recipes"
LM_TASKS = ("lm", "lm_eval", "extrapolation", "effective_rank", "throughput")
# every recipe of an LM task (found, not listed: a new one is checked without an edit here)
NAMES = [p.stem for p in sorted(RECIPES.glob("*.yaml")) if (read_recipe(p).get("task") or {}).get("name") in LM_TASKS]


def resolved(trial):
    out, info = solve(ModelConfig.from_dict(trial.config["model"]))
    return out, info


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("scale", [None, "cpu", "gpu_small"])
def test_recipe_expands(name, scale):
    e = expand(RECIPES / f"{name}.yaml", [f"scale={scale}"] if scale else [])
    assert e.trials
    for t in e.trials:
        assert t.config["task"]["name"] in LM_TASKS
        if scale == "cpu":
            assert t.config["hardware"]["device"] == "cpu"
            assert t.config["model"]["num_layers"] <= 2 and t.config["model"]["hidden_size"] <= 64


def test_table4_reproduces_the_authors_head_counts():
    rows = {(t.config["task"]["size"], t.config["model"]["num_householder"]): resolved(t)[0]
            for t in expand(RECIPES / "table4.yaml").trials}
    got = {k: (c.hidden_size, c.num_heads, c.key_dim) for k, c in rows.items()}
    # automl/DeltaProduct language_modeling/model_configs: delta_product_{213m,340m,805m}_-1_1_{1,2,3}_4k
    assert got == {("213M", 1): (768, 8, 128), ("213M", 2): (736, 6, 128), ("213M", 3): (768, 4, 128),
                   ("392M", 1): (1024, 12, 128), ("392M", 2): (1024, 8, 128), ("392M", 3): (1024, 6, 128),
                   ("805M", 1): (1536, 16, 128), ("805M", 2): (1468, 12, 128), ("805M", 3): (1536, 8, 128)}


def test_table3_matches_parameters_by_head_dim():
    for t in expand(RECIPES / "table3.yaml").trials:
        out, info = resolved(t)
        size = float(t.config["task"]["size"][:-1]) * 1e6
        assert out.num_heads == t.config["model"]["num_heads"]  # heads fixed, head_dim solved
        assert abs(info["params"] - size) / size < 0.01
        assert out.key_dim == {1: 128, 2: 85, 3: 64}[out.num_householder]
    tc = expand(RECIPES / "table3.yaml").trials[0].config
    assert tc["task"]["tokens_per_step"] == 524288 and tc["train"]["warmup_steps"] == 512
    assert (tc["train"]["lr"], tc["train"]["min_lr_ratio"], tc["train"]["weight_decay"]) == (3e-4, 0.1, 0.01)
    assert tuple(tc["train"]["betas"]) == (0.9, 0.95) and tc["train"]["grad_clip"] == 1.0


def test_vocab_mismatch_is_a_recipe_error_before_any_trial(tmp_path):
    """Bad input: a tokenizer whose ids do not match model.vocab_size fails `dpx expand` with one line naming the
    key (exit 2, nothing written), for every LM task name; a matching pair expands."""
    import subprocess
    import sys

    from dpx.orchestrator.errors import RecipeError
    for task in ("lm", "lm_eval", "extrapolation", "effective_rank"):
        with pytest.raises(RecipeError, match=r"model.vocab_size: 32000 does not match tokenizer byte \(259 ids\)"):
            expand(RECIPES / "table3.yaml", ["scale=cpu", "task.tokenizer=byte", f"task.name={task}"])
    assert expand(RECIPES / "table3.yaml", ["scale=cpu", "task.tokenizer=byte", "model.vocab_size=259"]).trials
    p = subprocess.run([sys.executable, "-m", "dpx.orchestrator.cli", "expand", str(RECIPES / "table3.yaml"),
                        "scale=cpu", "task.tokenizer=byte"], capture_output=True, text=True, cwd=tmp_path,
                       env={**__import__("os").environ, "DPX_WORKSPACE": str(tmp_path / "ws")}, timeout=120)
    assert p.returncode == 2 and p.stdout == ""
    assert len(p.stderr.strip().splitlines()) == 1 and "model.vocab_size: 32000 does not match" in p.stderr
    assert list(tmp_path.iterdir()) == []
