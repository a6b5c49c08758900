"""Hydra-style overrides (sweeps, ranges, deletes), stacked scales, `base:` composition, and the golden ids of the
composed fig12 recipe (it must expand to exactly the trials of the 114-line copy it replaced)."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from dpx.orchestrator.errors import RecipeError
from dpx.orchestrator.trials import expand

RECIPES = Path(__file__).resolve().parent.parent / "recipes"

# sha256 (first 16 hex) of the space-joined trial ids the standalone fig12_beta01.yaml expanded to (commit 31a739b),
# per scale: the composed recipe must keep every id, or finished trials would run again.
FIG12_GOLDEN = {None: "ca5db268b90d6a14", "cpu": "399db86e23c33957", "gpu_small": "eb1d992656a000e4"}


@pytest.mark.parametrize("scale", [None, "cpu", "gpu_small"])
def test_fig12_composed_on_fig5_keeps_its_trial_ids(scale):
    ex = expand(RECIPES / "fig12_beta01.yaml", [f"scale={scale}"] if scale else [])
    digest = hashlib.sha256(" ".join(t.trial_id for t in ex.trials).encode()).hexdigest()[:16]
    assert digest == FIG12_GOLDEN[scale]
    assert ex.recipe == "fig12_beta01" and all(t.config["model"]["allow_neg_eigval"] is False for t in ex.trials)
    assert "negative control" in ex.meta.description
    assert len((RECIPES / "fig12_beta01.yaml").read_text().splitlines()) < 15


def _r(tmp_path, body: str, name: str = "r.yaml") -> Path:
    p = tmp_path / name
    p.write_text(body)
    return p


DEBUG = """
name: d
task: {name: debug, steps: 1}
grid:
  - {task.value: [1.0, 2.0]}
  - {task.steps: [5]}
scales:
  a: {task.sleep_s: 0.1, task.steps: 2}
  b: {task.steps: 3}
"""


def test_sweep_adds_an_axis_to_every_block(tmp_path):
    p = _r(tmp_path, DEBUG)
    ex = expand(p, ["task.sleep_s=0.0,0.5"])
    assert len(ex.trials) == 6 and "task.sleep_s" in ex.axes
    assert {t.config["task"]["sleep_s"] for t in ex.trials} == {0.0, 0.5}
    ex = expand(p, ["task.value=range(1,4)"])  # pins the axis in block 1, sweeps it in both blocks
    assert sorted({t.config["task"]["value"] for t in ex.trials}) == [1, 2, 3]
    assert len(ex.trials) == 6
    ex = expand(p, ["seeds=range(3)", "task.value=choice(7.0)"])
    assert {t.config["seed"] for t in ex.trials} == {0, 1, 2} and len(ex.trials) == 6
    # no grid at all: the sweep is the grid
    q = _r(tmp_path, "name: q\ntask: {name: debug}\n", "q.yaml")
    assert [t.config["task"]["steps"] for t in expand(q, ["task.steps=1,2,3"]).trials] == [1, 2, 3]


def test_values_parse_as_in_hydra(tmp_path):
    q = _r(tmp_path, "name: q\ntask: {name: debug}\n", "q.yaml")
    (t,) = expand(q, ["task.value=1e-3"]).trials  # YAML 1.1 read "1e-3" as a string
    assert t.config["task"]["value"] == 0.001
    (t,) = expand(q, ["~task.value", "+task.steps=4"]).trials
    assert t.config["task"]["steps"] == 4


def test_scales_stack_in_order(tmp_path):
    p = _r(tmp_path, DEBUG)
    ab = expand(p, ["scale=a", "scale=b"])
    # a scale's key pins a grid axis as an override does: b's task.steps=3 wins over a's 2 and block 2's 5
    assert {t.config["task"]["steps"] for t in ab.trials} == {3} and ab.raw["scale"] == "a+b"
    assert {t.config["task"]["sleep_s"] for t in ab.trials} == {0.1}
    ba = expand(p, ["scale=b", "scale=a"])
    assert {t.config["task"]["steps"] for t in ba.trials} == {2}
    assert [t.trial_id for t in expand(p, ["scale=[a,b]"]).trials] == [t.trial_id for t in ab.trials]
    # overrides come after every scale, whatever their order on the command line
    assert {t.config["task"]["steps"] for t in expand(p, ["task.steps=9", "scale=b"]).trials} == {9}


def test_base_composition(tmp_path):
    _r(tmp_path, DEBUG, "parent.yaml")
    child = _r(tmp_path, "base: parent\ntask: {sleep_s: 0.2}\nseeds: [3]\nscales: {b: {task.steps: 4}}\n",
               "child.yaml")
    ex = expand(child)
    assert ex.recipe == "child"  # a name is never inherited
    assert {t.config["task"]["sleep_s"] for t in ex.trials} == {0.2}
    assert {t.config["seed"] for t in ex.trials} == {3} and len(ex.trials) == 3
    assert {t.config["task"]["steps"] for t in expand(child, ["scale=b"]).trials} == {4}  # the child's scale b
    assert {t.config["task"]["sleep_s"] for t in expand(child, ["scale=a"]).trials} == {0.1}  # base's scale a


@pytest.mark.parametrize("body, overrides, match", [
    ("base: nope.yaml\n", [], r"c\.yaml:base: no such base recipe 'nope.yaml'"),
    ("base: c.yaml\n", [], "cycle"),
    ("base: [1]\n", [], "base: must be a recipe file"),
    ("task: {name: debug}\n", ["scale=x,y"], "scales stack, they do not sweep"),
    ("task: {name: debug}\n", ["hardware.max_parallel=1,2"], "only keys inside model, task, train, eval"),
    ("task: {name: debug}\n", ["task.steps=[1"], "cannot parse override 'task.steps=\\[1'"),
    ("task: {name: debug}\n", ["task.value=interval(0,1)"], "interval"),
    ("task: {name: debug}\n", ["base=x.yaml"], "unknown section 'base'"),
])
def test_bad_composition_and_overrides_are_one_line(tmp_path, body, overrides, match):
    p = _r(tmp_path, body, "c.yaml")
    with pytest.raises(RecipeError, match=match) as e:
        expand(p, overrides)
    assert "\n" not in e.value.line()


def test_cli_show_prints_resolved_configs(tmp_path, dpx):
    p = _r(tmp_path, DEBUG)
    r = dpx("show", str(p), "task.sleep_s=0.25", ws=tmp_path / "ws")
    assert r.returncode == 0, r.stderr
    assert "sleep_s: 0.25" in r.stdout and "grid:" in r.stdout
    r = dpx("show", str(p), "--trial", "1", ws=tmp_path / "ws")
    assert r.returncode == 0, r.stderr
    ex = expand(p)
    assert f"trial_id: {ex.trials[1].trial_id}" in r.stdout and "value: 2.0" in r.stdout
    r = dpx("show", str(p), "--trial", ex.trials[2].trial_id[:6], ws=tmp_path / "ws")
    assert r.returncode == 0 and "steps: 5" in r.stdout
    r = dpx("show", str(p), "--trial", "7", ws=tmp_path / "ws")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no trial 7" in r.stderr
    assert not (tmp_path / "ws").exists()
