"""The synthetic-task recipes: they expand to the paper's grids, bad task settings are one-line recipe errors with
the key path, and (slow) the quickstart reproduces the paper's S3 claim through real training."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dpx.orchestrator.errors import RecipeError
from dpx.orchestrator.trials import expand
from dpx.tasks import TASKS
from dpx.tasks.context import RunContext

RECIPES = Path(__file__).resolve().parent.parent / "recipes"


def axes(trials, *keys):
    out = []
    for t in trials:
        row = []
        for k in keys:
            sec, _, name = k.partition(".")
            row.append(t.config[sec][name] if name else t.config[sec])
        out.append(tuple(row))
    return out


def test_fig5_and_fig12_grids():
    for name, neg in (("fig5_state_tracking", True), ("fig12_beta01", False)):
        e = expand(RECIPES / f"{name}.yaml")
        pts = axes(e.trials, "task.group", "model.vocab_size", "model.num_layers", "model.num_householder")
        assert len(pts) == 52 == len(set(pts))
        one_layer = {(g, n) for g, _, layers, n in pts if layers == 1}
        assert one_layer == {(g, n) for g in ("S3", "S4", "A5", "S5") for n in (1, 2, 3, 4)}
        deep = {(g, layers) for g, _, layers, n in pts if n == 1}
        assert deep == {(g, layers) for g in ("S3", "S4", "A5", "S5") for layers in range(1, 11)}
        assert {(g, v) for g, v, _, _ in pts} == {("S3", 13), ("S4", 31), ("A5", 67), ("S5", 127)}
        m = e.trials[0].config["model"]
        assert m["num_heads"] == 12 and m["head_dim"] == 32 and m["allow_neg_eigval"] is neg
        assert e.trials[0].config["train"]["lr"] == 1e-3 and e.trials[0].config["task"]["train_len"] == 128
        small = expand(RECIPES / f"{name}.yaml", ["scale=gpu_small"]).trials
        assert len(small) == 16 and {t.config["model"]["num_layers"] for t in small} == {1}


def test_table2_grid():
    e = expand(RECIPES / "table2_formal_languages.yaml")
    pts = axes(e.trials, "task.language", "model.family", "model.num_householder", "model.allow_neg_eigval", "seed")
    assert len(pts) == 72 == len(set(pts))
    assert {(f, n) for _, f, n, _, _ in pts} == {("deltanet", 1), ("deltaproduct", 2), ("deltaproduct", 3),
                                                 ("deltaproduct", 4)}
    for t in e.trials:
        lang, cfg = t.config["task"]["language"], t.config
        assert cfg["model"]["vocab_size"] == {"parity": 3, "mod_arith": 10, "mod_arith_brackets": 12}[lang]
        assert cfg["train"]["steps"] == (20000 if lang == "parity" else 100000)


def test_quickstart_grid():
    e = expand(RECIPES / "quickstart.yaml")
    assert sorted(axes(e.trials, "model.num_householder", "model.allow_neg_eigval")) == [(1, True), (2, False),
                                                                                         (2, True)]


@pytest.mark.parametrize("override,path,reason", [
    ("task.group=S6", "task.group", "did you mean"),
    ("task.train_len=0", "task.train_len", "must be > 0"),
    ("task.test_len=16", "task.test_len", "shorter than train_len"),
])
def test_bad_word_problem_settings_are_recipe_errors(override, path, reason):
    with pytest.raises(RecipeError) as ei:
        expand(RECIPES / "quickstart.yaml", [override])
    msg = str(ei.value)
    assert path in msg and reason in msg and "\n" not in msg


@pytest.mark.parametrize("override,path", [("task.language=parityy", "task.language"),
                                           ("task.test_max_len=10", "task.test_max_len")])
def test_bad_formal_language_settings_are_recipe_errors(override, path):
    with pytest.raises(RecipeError, match=path.replace(".", r"\.")):
        expand(RECIPES / "table2_formal_languages.yaml", [override])


def test_vocab_too_small_fails_the_trial_with_the_key(tmp_path):
    from dpx.orchestrator.errors import RecipeError

    # at recipe time: the orchestrator asks the task to check the model section
    with pytest.raises(RecipeError, match=r"quickstart\.yaml:model\.vocab_size: 7 cannot hold"):
        expand(RECIPES / "quickstart.yaml", ["model.vocab_size=7"])
    # and the trial itself refuses too (a config edited after expansion, or a run dir run by hand)
    t = expand(RECIPES / "quickstart.yaml").trials[0]
    config = {**t.config, "model": {**t.config["model"], "vocab_size": 7}}
    with pytest.raises(ValueError, match=r"^model\.vocab_size: 7 cannot hold"):
        TASKS["word_problem"].run_fn()(config, RunContext(tmp_path, config))


@pytest.mark.slow
def test_quickstart_shows_the_paper_claim(tmp_path):
    """Real training of the quickstart's three trials (about 4-5 CPU-minutes): DeltaProduct_2 with beta in [0,2]
    reaches >= 0.9 prefix accuracy at the training length; n_h = 1, and n_h = 2 with beta in [0,1], stay far below."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        results = {}
        for t in expand(RECIPES / "quickstart.yaml").trials:
            m = t.config["model"]
            results[(m["num_householder"], m["allow_neg_eigval"])] = TASKS["word_problem"].run_fn()(
                t.config, RunContext(tmp_path / t.trial_id, t.config))
    finally:
        torch.set_num_threads(n)
    assert results[(2, True)]["acc_at_train_len"] >= 0.9
    assert results[(1, True)]["acc_at_train_len"] < 0.2
    assert results[(2, False)]["acc_at_train_len"] < 0.2
