"""What a user sees in MLflow, from a real submission into a real SQLite tracking store: the experiment is a model
training one (the UI must not open it in GenAI mode) and carries the recipe's description; child runs are named by
their grid point; a rerun's trials move under the rerun's parent run and lose the failed attempt's error tag."""
from __future__ import annotations

import json

import pytest

from dpx.orchestrator.tracking import run_label

RECIPE = """
name: mlview
description: "debug sweep: does the MLflow view read well?"
task: {name: debug, steps: 2, sleep_s: 0.0}
grid: {task.value: [1.0, 2.0], task.fail_on_attempts: [0, 1]}
hardware: {max_parallel: 2}
"""


def test_run_label_reads_like_the_paper():
    assert run_label({"model.num_householder": 2, "model.allow_neg_eigval": True, "seed": 0}, "x") == \
        "n_h=2 β∈[0,2] seed=0"
    assert run_label(json.dumps({"task.group": "S3", "model.allow_neg_eigval": False, "train.lr": 0.001}), "x") \
        == "S3 β∈[0,1] lr=0.001"
    assert run_label({}, "abc123") == "abc123" and run_label(None, "abc123") == "abc123"


@pytest.mark.slow
def test_mlflow_experiment_kind_description_names_and_rerun_parent(tmp_path, dpx):
    from mlflow import MlflowClient

    ws = tmp_path / "ws"
    recipe = tmp_path / "mlview.yaml"
    recipe.write_text(RECIPE)
    r = dpx("submit", str(recipe), "--wait", ws=ws, timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr  # two trials fail their first attempt by design
    client = MlflowClient(f"sqlite:///{ws}/mlflow.db")
    exp = client.get_experiment_by_name("mlview")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    assert exp.tags["mlflow.note.content"].startswith("debug sweep: does the MLflow view read well?")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    parents = [x for x in runs if x.data.tags.get("dpx.kind") == "submission"]
    children = {x.data.tags["dpx.trial_id"]: x for x in runs if x.data.tags.get("dpx.kind") == "trial"}
    assert len(parents) == 1 and len(children) == 4
    names = sorted(x.info.run_name for x in children.values())
    assert names == [f"value={v} fail_on_attempts={f} seed=0" for v in (1, 2) for f in (0, 1)]
    failed = {t for t, x in children.items() if x.info.status == "FAILED"}
    assert len(failed) == 2 and all("injected failure" in children[t].data.tags["dpx.error"] for t in failed)

    r = dpx("rerun", "mlview", "--failed", "--wait", ws=ws, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    runs = client.search_runs([exp.experiment_id], max_results=100)
    parents = sorted((x for x in runs if x.data.tags.get("dpx.kind") == "submission"),
                     key=lambda x: x.info.start_time)
    assert len(parents) == 2 and parents[1].info.status == "FINISHED"
    children = {x.data.tags["dpx.trial_id"]: x for x in runs if x.data.tags.get("dpx.kind") == "trial"}
    assert len(children) == 4  # the rerun continued the trials' runs, it made no new ones
    for t in failed:
        c = children[t]
        assert c.info.status == "FINISHED" and c.data.tags["dpx.status"] == "completed"
        assert "dpx.error" not in c.data.tags  # the failed attempt's error is gone
        assert c.data.tags["mlflow.parentRunId"] == parents[1].info.run_id  # under the rerun's parent
    for t in set(children) - failed:
        assert children[t].data.tags["mlflow.parentRunId"] == parents[0].info.run_id
