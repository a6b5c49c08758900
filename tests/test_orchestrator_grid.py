"""Grid grammar: product, zip, union, seeds, scales, CLI overrides pinning axes, dedupe of identical points."""
from __future__ import annotations

import pytest

from dpx.orchestrator.errors import RecipeError
from dpx.orchestrator.grid import expand_grid
from dpx.orchestrator.trials import expand


def test_product_zip_union():
    assert expand_grid({"model.a": [1, 2], "train.b": [3, 4, 5]}) == [
        {"model.a": a, "train.b": b} for a in (1, 2) for b in (3, 4, 5)]
    z = expand_grid({"zip": {"model.a": [1, 2, 3], "model.h": [12, 6, 4]}, "train.lr": [0.1, 0.2]})
    assert len(z) == 6 and {"model.a": 2, "model.h": 6, "train.lr": 0.2} in z
    assert {"model.a": 2, "model.h": 12, "train.lr": 0.1} not in z  # zipped, not crossed
    u = expand_grid([{"model.a": [1, 2]}, {"model.a": [3], "model.b": [0, 1]}])
    assert u == [{"model.a": 1}, {"model.a": 2}, {"model.a": 3, "model.b": 0}, {"model.a": 3, "model.b": 1}]
    two_zips = expand_grid({"zip": [{"model.a": [1, 2], "model.b": [3, 4]}, {"train.x": [5, 6], "train.y": [7, 8]}]})
    assert len(two_zips) == 4
    assert expand_grid(None) == [{}] and expand_grid({"model.a": 7}) == [{"model.a": 7}]


@pytest.mark.parametrize("grid, msg", [
    ({"zip": {"model.a": [1, 2], "model.b": [1]}}, "zip axes differ in length"),
    ({"model.a": []}, "expands to no trial"),
    ({"num_layers": [1]}, "dotted key"),
    ({"hardware.backend": ["ray"]}, "dotted key"),
    ([1, 2], "grid block is a mapping"),
])
def test_grid_errors(grid, msg):
    with pytest.raises(RecipeError, match=msg):
        expand_grid(grid, "r.yaml")


def _recipe(tmp_path, body: str):
    p = tmp_path / "r.yaml"
    p.write_text(body)
    return p


BASE = """
name: g
task: {name: debug, steps: 1}
grid:
  - {task.value: [1.0, 2.0]}
  - zip: {task.steps: [1, 2, 3], task.sleep_s: [0.0, 0.1, 0.2]}
seeds: [0, 1]
scales:
  tiny: {task.steps: 0, seeds: [0]}
"""


def test_expand_counts_seeds_and_axes(tmp_path):
    ex = expand(_recipe(tmp_path, BASE))
    # block 1: 2 points; block 2: 3 points, but (steps=1, sleep=0.0, value=1.0) equals block 1's value=1.0 point
    # (steps 1 and sleep 0.0 are the base values) → deduped: 2 + 3 - 1 = 4 points × 2 seeds
    assert len(ex.trials) == 8
    assert len({t.trial_id for t in ex.trials}) == 8
    assert set(ex.axes) == {"task.value", "task.steps", "task.sleep_s", "seed"}
    assert {t.config["seed"] for t in ex.trials} == {0, 1}


def test_scale_and_override_pin_axes(tmp_path):
    p = _recipe(tmp_path, BASE)
    ex = expand(p, ["scale=tiny"])
    assert {t.config["seed"] for t in ex.trials} == {0}
    assert ex.raw["scale"] == "tiny"
    pinned = expand(p, ["task.value=5.0"])  # pins the task.value axis
    assert {t.config["task"]["value"] for t in pinned.trials} == {5.0}
    with pytest.raises(RecipeError, match="unknown scale 'tiyn'.*did you mean 'tiny'"):
        expand(p, ["scale=tiyn"])


def test_override_pinning_a_whole_zip_group(tmp_path):
    p = _recipe(tmp_path, """
name: z
task: {name: debug}
grid:
  zip: {task.steps: [1, 2], task.value: [1.0, 2.0]}
  task.sleep_s: [0.0, 0.1]
""")
    ex = expand(p, ["task.steps=5", "task.value=3.0"])
    assert len(ex.trials) == 2
    assert {(t.config["task"]["steps"], t.config["task"]["value"]) for t in ex.trials} == {(5, 3.0)}


def test_interpolation(tmp_path):
    p = _recipe(tmp_path, """
name: interp
task: {name: debug, steps: 4, sleep_s: 0.0, value: "${task.steps}"}
""")
    (t,) = expand(p).trials
    assert t.config["task"]["value"] == 4.0


def test_large_grid_is_fast(tmp_path):
    import time

    p = _recipe(tmp_path, """
name: big
task: {name: debug}
grid: {task.value: [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0], task.steps: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]}
seeds: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
""")
    t0 = time.perf_counter()
    ex = expand(p)
    assert len(ex.trials) == 2000 and len({t.trial_id for t in ex.trials}) == 2000
    assert time.perf_counter() - t0 < 10  # correctness guard only; speed goals live in benchmarks/
