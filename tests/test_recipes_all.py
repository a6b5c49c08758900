"""Every recipe in recipes/ at every one of its scales: it expands (a valid grid, every section validated), it
has the `cpu` and `gpu_small` scales the issue asks of each experiment, its cpu scale is CPU-sized, and its trial
ids are the golden ones (tests/golden_recipe_ids.json): a change that alters the ids of a recipe must be meant
(the recipe changed, or its `version` was bumped because results change) and then recorded with
`python tests/test_recipes_all.py --update`."""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("omegaconf")
import yaml  # noqa: E402

from dpx.orchestrator.trials import expand  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
GOLDEN = Path(__file__).with_name("golden_recipe_ids.json")
# the quickstart is its own scale (the CPU minutes of the README); "seeds" repeats it over five seeds
NO_SMALL_SCALES = {"quickstart"}
LM_TASKS = ("lm", "lm_eval", "extrapolation", "effective_rank")  # the tasks that train on text (not throughput)


def scales_of(path: Path) -> list[str | None]:
    from dpx.orchestrator.load import read_recipe  # with its `base:` recipes merged (fig12 composes fig5's scales)

    return [None] + list(read_recipe(path).get("scales") or {})


CASES = [(p, s) for p in RECIPES for s in scales_of(p)]


def digest(trials) -> str:
    return f"{len(trials)}:" + hashlib.sha1(",".join(t.trial_id for t in trials).encode()).hexdigest()[:12]


def all_digests() -> dict[str, str]:
    return {f"{p.stem}:{s or 'full'}": digest(expand(p, [f"scale={s}"] if s else []).trials) for p, s in CASES}


@pytest.mark.parametrize("path,scale", CASES, ids=[f"{p.stem}:{s or 'full'}" for p, s in CASES])
def test_recipe_scale_expands(path, scale):
    e = expand(path, [f"scale={scale}"] if scale else [])
    assert e.trials and len({t.trial_id for t in e.trials}) == len(e.trials)
    if scale == "cpu":
        for t in e.trials:
            hw, m = t.config["hardware"], t.config.get("model") or {}
            assert hw.get("device", "cpu") in ("cpu", "auto") and not hw.get("gpus_per_trial")
            assert m.get("hidden_size", 0) <= 64 and m.get("num_layers", 1) <= 2


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_every_experiment_has_cpu_and_gpu_small_scales(path):
    if path.stem in NO_SMALL_SCALES:
        pytest.skip("the quickstart is CPU-sized itself")
    assert {"cpu", "gpu_small"} <= set(s for s in scales_of(path) if s)


def test_trial_ids_are_golden():
    golden = json.loads(GOLDEN.read_text())
    now = all_digests()
    changed = sorted(k for k in now if k in golden and golden[k] != now[k])
    new = sorted(set(now) - set(golden))
    gone = sorted(set(golden) - set(now))
    assert not (changed or new or gone), (
        f"trial ids changed: {changed}; recipes/scales not recorded: {new}; recorded but gone: {gone}. If meant, "
        "run `python tests/test_recipes_all.py --update` (and bump `version` where results change)")


if __name__ == "__main__" and "--update" in sys.argv:
    GOLDEN.write_text(json.dumps(all_digests(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")


def test_fig5_full_scale_is_the_authors_setting():
    """App. C.1 + the authors' state_tracking code: d = 128, 12 heads of 32, untied head, init std 0.02, no clipping,
    AdamW (0.9, 0.999) wd 1e-6, batch 2048, lr 1e-3; the probe runs (Figs. 7 / 13)."""
    t = expand(ROOT / "recipes" / "fig5_state_tracking.yaml").trials[0].config
    m, tr = t["model"], t["train"]
    assert (m["hidden_size"], m["num_heads"], m["head_dim"], m["tie_embeddings"], m["init_std"]) == (128, 12, 32, False, 0.02)
    assert (tr["grad_clip"], tr["batch_size"], tr["lr"], tuple(tr["betas"]), tr["weight_decay"]) == \
        (0.0, 2048, 1e-3, (0.9, 0.999), 1e-6)
    assert t["eval"]["probe"] is True and t["task"]["train_len"] == 128 and t["task"]["test_len"] == 512
    gpu = expand(ROOT / "recipes" / "fig5_state_tracking.yaml", ["scale=gpu"]).trials
    assert len(gpu) == 16 and all(x.config["model"]["hidden_size"] == 128 and x.config["model"]["num_heads"] == 12
                                  for x in gpu)
    one = {(x.config["task"]["group"], x.config["model"]["num_householder"]) for x in gpu
           if x.config["model"]["num_layers"] == 1}
    assert one == {(g, n) for g in ("S3", "S4", "A5", "S5") for n in (1, 2, 4)}


def test_lm_recipes_read_fineweb_100bt_where_the_budget_exceeds_10bt():
    """Every full-scale LM training trial of every recipe: more than sample-10BT's 10B tokens -> fineweb_100bt."""
    seen = set()
    for p in RECIPES:
        for t in expand(p).trials:
            task = t.config["task"]
            if task["name"] not in LM_TASKS or task.get("checkpoint") or not task.get("tokens_per_step"):
                continue
            tokens = t.config["train"]["steps"] * task["tokens_per_step"]
            if tokens > 10e9:
                seen.add(p.stem)
                assert task["dataset"] == "fineweb_100bt", (p.stem, tokens)
    assert {"table3", "table4", "fig8_extrapolation", "fig9_effective_rank"} <= seen, seen
