"""`dpx server` as a real `mlflow server` process, and a Ray recipe (local Ray instance sized from the recipe)
whose driver logs to it by URI: experiment, parent run, child runs with metric history and final metrics land in
the server's store, none in the workspace's own SQLite file; artifacts are uploaded through the server."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

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


PG_BIN = Path("/usr/lib/postgresql/15/bin")


@pytest.fixture
def postgres(tmp_path):
    """A throwaway PostgreSQL (Debian's postgresql package) on a free loopback port, trust auth, stopped after."""
    if not (PG_BIN / "initdb").exists() or os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs Debian's postgresql 15 and root (initdb runs as the postgres user)")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg is not installed (pip install 'psycopg[binary]')")
    d = Path(tempfile.mkdtemp(prefix="dpxpg", dir="/tmp"))
    shutil.chown(d, "postgres")
    port = free_port()
    pg = ["runuser", "-u", "postgres", "--"]
    subprocess.run(pg + [str(PG_BIN / "initdb"), "-D", f"{d}/data", "-A", "trust", "-U", "postgres"], check=True,
                   capture_output=True, timeout=120)
    subprocess.run(pg + [str(PG_BIN / "pg_ctl"), "-D", f"{d}/data", "-l", f"{d}/log", "-w", "-o",
                         f"-p {port} -k {d} -c listen_addresses=127.0.0.1 -c shared_buffers=16MB", "start"],
                   check=True, capture_output=True, timeout=120)
    try:
        subprocess.run(pg + [str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(port), "mlflow"], check=True,
                       capture_output=True, timeout=60)
        yield f"postgresql://postgres@127.0.0.1:{port}/mlflow"
    finally:
        subprocess.run(pg + [str(PG_BIN / "pg_ctl"), "-D", f"{d}/data", "-m", "fast", "-w", "stop"],
                       capture_output=True, timeout=120)
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.slow
def test_server_on_postgresql(tmp_path, postgres):
    srv_ws, port = tmp_path / "server", free_port()
    r = run_dpx("server", "--port", str(port), "--store", postgres, "--detach", ws=srv_ws, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        from mlflow.tracking import MlflowClient

        c = MlflowClient(tracking_uri=f"http://127.0.0.1:{port}")
        run = c.create_run(c.create_experiment("pg"))
        for step, v in enumerate((0.5, 0.25)):
            c.log_metric(run.info.run_id, "loss", v, step=step)
        import psycopg

        with psycopg.connect(postgres) as con:  # the points are in PostgreSQL itself
            rows = con.execute("SELECT step, value FROM metrics WHERE run_uuid = %s ORDER BY step",
                               (run.info.run_id,)).fetchall()
        assert rows == [(0, 0.5), (1, 0.25)]
        assert not (srv_ws / "mlflow.db").exists()
    finally:
        assert run_dpx("server", "--stop", ws=srv_ws).returncode == 0
