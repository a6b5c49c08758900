"""`dpx server` as a real `mlflow server` process, and a Ray recipe (local Ray instance sized from the recipe)
whose driver logs to it by URI: experiment, parent run, child runs with metric history and final metrics land in
the server's store, none in the workspace's own SQLite file; artifacts are uploaded through the server."""
from __future__ import annotations

import socket

import pytest

from conftest import run_dpx, write_recipe


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_server_rejects_file_store_and_missing_postgres_driver(tmp_path):
    r = run_dpx("server", "--store", "file:./mlruns", ws=tmp_path / "ws")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "SQL store" in r.stderr, r.stderr
    r = run_dpx("server", "--store", "postgresql+nosuchdriver://u@127.0.0.1/db", ws=tmp_path / "ws")
    assert r.returncode == 2 and "nosuchdriver" in r.stderr, r.stderr


@pytest.mark.slow
def test_ray_recipe_logs_to_a_real_mlflow_server(tmp_path):
    srv_ws, ws, port = tmp_path / "server", tmp_path / "ws", free_port()
    r = run_dpx("server", "--port", str(port), "--detach", ws=srv_ws, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    uri = f"http://127.0.0.1:{port}"
    assert f"export DPX_MLFLOW_URI={uri}" in r.stdout
    try:
        recipe = write_recipe(tmp_path / "sv.yaml", f"""
name: sv
task: {{name: debug, steps: 3}}
grid: {{task.value: [1.5, 2.5]}}
hardware: {{backend: ray, ray: {{num_cpus: 2}}}}
tracking: {{mlflow_uri: "{uri}"}}
""")
        r = run_dpx("submit", str(recipe), "--wait", ws=ws, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        from mlflow.tracking import MlflowClient

        c = MlflowClient(tracking_uri=uri)
        exp = c.get_experiment_by_name("sv")
        assert exp is not None
        runs = c.search_runs([exp.experiment_id])
        parents = [x for x in runs if x.data.tags.get("dpx.kind") == "submission"]
        kids = [x for x in runs if x.data.tags.get("dpx.kind") == "trial"]
        assert len(parents) == 1 and parents[0].info.status == "FINISHED"
        assert len(kids) == 2
        assert sorted(k.data.metrics["final/score"] for k in kids) == [1.5, 2.5]
        for k in kids:
            assert k.info.status == "FINISHED"
            assert k.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
            assert [m.step for m in c.get_metric_history(k.info.run_id, "loss")] == [0, 1, 2]
        assert not (ws / "mlflow.db").exists()  # the driver used the server, not a local store
        # artifacts are served: a client with no access to the server's disk uploads over HTTP into its root
        note = tmp_path / "note.txt"
        note.write_text("from a worker")
        c.log_artifact(kids[0].info.run_id, str(note))
        assert [a.path for a in c.list_artifacts(kids[0].info.run_id)] == ["note.txt"]
        (stored,) = (srv_ws / "mlruns").rglob("note.txt")
        assert stored.read_text() == "from a worker"
    finally:
        r = run_dpx("server", "--stop", ws=srv_ws)
        assert r.returncode == 0, r.stderr
