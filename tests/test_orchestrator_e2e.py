"""End to end on the local backend, through the real CLI, against a real MLflow SQLite store and a real DuckDB file:
submit → driver → runner → run dirs → MLflow parent/child runs → DuckDB; resubmit, grow, rerun --failed."""
from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

RECIPE = """
name: e2e
task: {name: debug, steps: 3, sleep_s: 0.1}
grid:
  task.value: [1.0, 2.0]
  task.fail_on_attempts: [0, 1]
hardware: {max_parallel: 2}
"""


def _pid_alive(pid) -> bool:
    if not pid:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has ended
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def _trials(ws):
    con = sqlite3.connect(ws / "state.db")
    con.row_factory = sqlite3.Row
    return {r["trial_id"]: dict(r) for r in con.execute("SELECT * FROM trials")}


def test_submit_rerun_grow_query_mlflow(tmp_path, dpx):
    ws = tmp_path / "ws"
    recipe = tmp_path / "e2e.yaml"
    recipe.write_text(RECIPE)

    r = dpx("submit", str(recipe), "--wait", ws=ws)
    assert r.returncode == 1, r.stdout + r.stderr  # two trials fail their first attempt by design
    assert "e2e: results" in r.stdout and "injected failure (attempt 1)" in r.stdout
    t = _trials(ws)
    assert sorted(x["status"] for x in t.values()) == ["completed", "completed", "failed", "failed"]
    failed = {k for k, v in t.items() if v["status"] == "failed"}

    st = dpx("status", str(recipe), ws=ws)
    assert st.returncode == 0 and "injected failure" in st.stdout

    # the same recipe again runs nothing
    r = dpx("submit", str(recipe), "--wait", ws=ws)
    assert "nothing to run" in r.stdout
    assert all(v["attempts"] == 1 for v in _trials(ws).values())

    # rerun --failed: only the failed ones run again, and now pass (attempt 2)
    r = dpx("rerun", str(recipe), "--failed", "--wait", ws=ws)
    assert r.returncode == 0, r.stdout + r.stderr
    t2 = _trials(ws)
    assert all(v["status"] == "completed" for v in t2.values())
    assert {k for k, v in t2.items() if v["attempts"] == 2} == failed
    assert {k for k, v in t2.items() if v["attempts"] == 1} == set(t2) - failed
    for k in set(t2) - failed:  # untouched: one attempt in the log
        assert (ws / "runs" / "e2e" / k / "log.txt").read_text().count("===== attempt") == 1

    # a grown grid runs only the new points
    recipe.write_text(RECIPE.replace("[1.0, 2.0]", "[1.0, 2.0, 3.0]"))
    r = dpx("submit", str(recipe), "--wait", ws=ws)
    t3 = _trials(ws)
    assert len(t3) == 6
    new = set(t3) - set(t2)
    assert len(new) == 2 and all(t3[k]["attempts"] == 1 for k in new)
    assert all(t3[k]["attempts"] == t2[k]["attempts"] for k in t2)

    # DuckDB: trials and long metrics
    q = dpx("query", "SELECT status, count(*) AS n FROM trials GROUP BY status ORDER BY status", "--format", "json",
            ws=ws)
    assert q.returncode == 0, q.stderr
    rows = json.loads(q.stdout)
    assert {r["status"]: r["n"] for r in rows} == {"completed": 5, "failed": 1}
    q = dpx("query", "SELECT count(*) AS n FROM metrics WHERE key = 'loss'", "--format", "csv", ws=ws)
    assert q.stdout.splitlines() == ["n", str(6 * 3 + 2 * 3)], q.stdout  # 6 trials × 3 steps + 2 reruns × 3
    bad = dpx("query", "SELEC nonsense", ws=ws)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1

    # MLflow: one parent run per submission that ran something, one child per trial, tagged with the parent
    import mlflow

    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{ws / 'mlflow.db'}")
    exp = client.get_experiment_by_name("e2e")
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parents = {r.info.run_id for r in runs if r.data.tags.get("dpx.kind") == "submission"}
    children = [r for r in runs if r.data.tags.get("dpx.kind") == "trial"]
    assert len(children) == 6 and {c.data.tags["dpx.trial_id"] for c in children} == set(t3)
    assert all(c.data.tags["mlflow.parentRunId"] in parents for c in children)
    c0 = children[0]
    assert c0.data.params["task.name"] == "debug" and "task.value" in c0.data.params
    hist = client.get_metric_history(c0.info.run_id, "loss")
    assert sorted(m.step for m in hist)[:3] == [0, 1, 2]
    assert any(a.path == "result.json" for a in client.list_artifacts(c0.info.run_id)) or \
        c0.info.status == "FAILED"

    # sync is idempotent: nothing new, no duplicated points
    s = dpx("sync", ws=ws)
    assert s.returncode == 0
    assert len(client.get_metric_history(c0.info.run_id, "loss")) == len(hist)


def test_submit_returns_at_once_and_cancel(tmp_path, dpx):
    ws = tmp_path / "ws"
    recipe = tmp_path / "slow.yaml"
    recipe.write_text("name: slow\ntask: {name: debug, steps: 100, sleep_s: 60}\ngrid: {task.value: [1.0, 2.0, 3.0]}\n"
                      "hardware: {max_parallel: 1}\n")
    t0 = time.time()
    r = dpx("submit", str(recipe), ws=ws)
    assert r.returncode == 0 and time.time() - t0 < 30
    deadline = time.time() + 60
    while time.time() < deadline and not any(v["status"] == "running" for v in _trials(ws).values()):
        time.sleep(0.5)
    assert any(v["status"] == "running" for v in _trials(ws).values())
    lg = dpx("logs", next(k for k, v in _trials(ws).items() if v["status"] == "running")[:6], ws=ws)
    assert "attempt 1" in lg.stdout
    c = dpx("cancel", str(recipe), ws=ws)
    assert c.returncode == 0, c.stderr
    deadline = time.time() + 60
    while time.time() < deadline and any(v["status"] in ("running", "pending") for v in _trials(ws).values()):
        time.sleep(0.5)
    assert sorted(v["status"] for v in _trials(ws).values()) == ["cancelled"] * 3
    # and the driver ends (it once kept polling forever on its stale queue of cancelled trials)
    con = sqlite3.connect(ws / "state.db")
    pid = con.execute("SELECT driver_pid FROM submissions").fetchone()[0]
    con.close()
    deadline = time.time() + 30
    while time.time() < deadline and _pid_alive(pid):
        time.sleep(0.5)
    assert not _pid_alive(pid), "the driver of a cancelled submission is still running"


def test_failure_modes(tmp_path, dpx):
    ws = tmp_path / "ws"
    recipe = tmp_path / "modes.yaml"
    recipe.write_text("""
name: modes
task: {name: debug, steps: 2}
grid:
  - {task.exit_code: [7]}
  - {task.nan_at_step: [1]}
  - {task.sleep_s: [120.0], task.steps: [0]}
  - {task.fail_on_attempts: [1], task.value: [9.0]}
hardware: {max_parallel: 2, timeout_min: 0.1, max_retries: 1}
""")
    r = dpx("submit", str(recipe), "--wait", ws=ws, timeout=400)
    t = _trials(ws)
    by = {}
    for v in t.values():
        c = json.loads(v["config"])["task"]
        key = "exit" if c["exit_code"] else "nan" if c["nan_at_step"] >= 0 else "timeout" if c["sleep_s"] else "retry"
        by[key] = v
    assert by["exit"]["status"] == "failed" and "exited with code 7" in by["exit"]["error"]
    assert by["nan"]["status"] == "failed" and "step 1" in by["nan"]["error"]
    assert by["timeout"]["status"] == "failed" and "timed out" in by["timeout"]["error"]
    assert by["retry"]["status"] == "completed" and by["retry"]["attempts"] == 2  # max_retries: 1
    assert by["exit"]["attempts"] == 2  # retried once, then failed
    assert r.returncode == 1
