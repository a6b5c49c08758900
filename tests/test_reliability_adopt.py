"""What a killed driver leaves behind. A trial started but whose pid was not recorded yet (local backend): the next
driver must adopt the still-running worker (it registers itself in its run dir), not settle it as "worker lost"
and run it a second time. Its MLflow parent and child runs: `dpx sync` closes them as the trials' states say, and
the next driver adopts them and closes them when it ends. Real runner processes in their own sessions, the real
CLI, the real state store and MLflow SQLite store."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_reliability_faults import (  # noqa: F401  (mlflow_template: the session fixture, shared)
    attempts_in_log, dead_submission, expand_ids, mlflow_template, new_ws, submissions, trials, wait_for)


def test_started_but_unrecorded_trials_are_adopted_not_lost(tmp_path, dpx):
    from dpx.orchestrator.driver.attempts import write_run_dir

    recipe = tmp_path / "adopt.yaml"
    recipe.write_text("name: adopt\ntask: {name: debug, steps: 4, sleep_s: 4.0}\ntracking: {enabled: false}\n"
                      "grid: {task.value: [1.0, 2.0, 3.0]}\nhardware: {max_parallel: 2, max_retries: 1}\n")
    ex, w, store = dead_submission(tmp_path, recipe)
    running, late, untouched = (t.trial_id for t in ex.trials)
    procs = {}
    for tid, delay in ((running, 0), (late, 3)):  # `late`: its Python still starting when the next driver looks
        row = store.claim("adopt", tid, "dead")
        d = Path(row["run_dir"])
        write_run_dir(d, json.loads(row["config"]))
        with open(d / "log.txt", "ab") as log:  # what the local backend does, up to the spawn...
            log.write(f"\n===== attempt 1 {time.strftime('%Y-%m-%d %H:%M:%S')} =====\n".encode())
            cmd = [sys.executable, "-m", "dpx.orchestrator.trial.runner", str(d), "--attempt", "1"]
            if delay:
                cmd = ["sh", "-c", f'sleep {delay}; exec "$@"', "sh", *cmd]
            procs[tid] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=d, start_new_session=True,
                                          env={**os.environ, "DPX_FORKSERVER": "0"})
        # ... and the driver is SIGKILLed before `set_trial(pid=...)`: the state store has no pid for either
    store.close()
    assert all(r["pid"] is None and r["status"] == "running" for t, r in trials(w.root).items() if t != untouched)

    r = dpx("submit", str(recipe), "--wait", ws=w.root)
    for p in procs.values():
        p.wait(timeout=60)
    t = trials(w.root)
    assert r.returncode == 0, r.stdout + r.stderr
    for tid in (running, late, untouched):
        assert t[tid]["status"] == "completed" and t[tid]["attempts"] == 1, t[tid]
        assert attempts_in_log(w.run_dir("adopt", tid)) == 1  # ran once: no second attempt beside the first
    for tid, p in procs.items():  # completed by the very process started before the driver died
        res = json.loads((w.run_dir("adopt", tid) / "result.json").read_text())
        assert res["pid"] == p.pid and res["attempt"] == 1
        assert t[tid]["pid"] == p.pid  # the adopting driver recorded the registered pid


# ---- a killed driver's MLflow runs: closed by `dpx sync`, adopted and closed by the next driver -----------------

@pytest.mark.slow
def test_killed_driver_mlflow_runs_closed_by_sync_and_next_driver(tmp_path, dpx, mlflow_template):
    from mlflow.tracking import MlflowClient

    ws = new_ws(tmp_path, mlflow_template)
    recipe = tmp_path / "orphp.yaml"
    recipe.write_text("""
name: orphp
task: {name: debug, steps: 4}
grid:
  - {task.value: [1.0], task.sleep_s: [10.0]}                   # a: ends while no driver runs
  - {task.value: [2.0], task.sleep_s: [40.0], task.steps: [10]}  # b: still running at the sync
  - {task.value: [3.0, 4.0]}                                    # pending when the driver dies
hardware: {max_parallel: 2}
""")
    ids = [p["trial_id"] for p in expand_ids(dpx, recipe)]
    a, b = ids[:2]
    r = dpx("submit", str(recipe), ws=ws)
    assert r.returncode == 0, r.stderr
    wait_for(lambda: (lambda t: t[a]["status"] == "running" and t[b]["mlflow_run_id"] and t[a]["mlflow_run_id"])(
        trials(ws)), 240, "a running and both a and b with a live MLflow child run")
    dead = submissions(ws)[0]
    os.kill(dead["driver_pid"], signal.SIGKILL)
    wait_for(lambda: (ws / "runs" / "orphp" / a / "result.json").exists(), 120, "a to finish without a driver")

    client = MlflowClient(tracking_uri=f"sqlite:///{ws / 'mlflow.db'}")
    exp = client.get_experiment_by_name("orphp").experiment_id
    assert client.get_run(dead["mlflow_parent_run_id"]).info.status == "RUNNING"  # what the kill left
    s = dpx("sync", ws=ws)
    assert s.returncode == 0, s.stdout + s.stderr
    t = trials(ws)
    assert t[a]["status"] == "completed" and t[a]["attempts"] == 1  # settled from its run dir by sync
    assert submissions(ws)[0]["state"] == "crashed"
    runs = client.search_runs([exp], max_results=100)
    assert [x.info.status for x in runs if x.info.run_id == dead["mlflow_parent_run_id"]] == ["KILLED"]  # work left
    assert not [x for x in runs if x.info.status == "RUNNING"], [(x.data.tags, x.info.status) for x in runs]
    assert client.get_run(t[a]["mlflow_run_id"]).info.status == "FINISHED"

    r = dpx("submit", str(recipe), "--wait", ws=ws, timeout=500)
    assert r.returncode == 0, r.stdout + r.stderr
    t = trials(ws)
    assert all(v["status"] == "completed" and v["attempts"] == 1 for v in t.values()), t
    runs = client.search_runs([exp], max_results=100)
    parents = {x.data.tags["dpx.submission"]: x.info.status for x in runs if x.data.tags.get("dpx.kind") == "submission"}
    assert parents == {s["id"]: "FINISHED" for s in submissions(ws)} and len(parents) == 2, parents
    children = [x for x in runs if x.data.tags.get("dpx.kind") == "trial"]
    assert sorted(x.data.tags["dpx.trial_id"] for x in children) == sorted(ids)  # one child run per trial
    assert all(x.info.status == "FINISHED" for x in children)
    assert all(attempts_in_log(Path(v["run_dir"])) == 1 for v in t.values())
