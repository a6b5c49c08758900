"""Faults injected for real, through the real CLI: SIGKILL of a trial's worker (local, Ray) and of the driver,
SIGTERM preemption of a training trial, a full disk and a blocked run dir, diverging training, two submits of one
recipe at once with queries while trials write. Each checks what the user relies on: the failing trial is marked
failed (or retried) with the reason, every other trial is untouched, nothing that finished runs again, and no
result row is lost or duplicated (state store, DuckDB, MLflow).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO

# ---- helpers --------------------------------------------------------------------------------------------------


def trials(ws: Path) -> dict[str, dict]:
    """trial_id → state row (read-only; the WAL lets us read while drivers write)."""
    con = sqlite3.connect(f"file:{ws / 'state.db'}?mode=ro", uri=True, timeout=60)
    con.row_factory = sqlite3.Row
    try:
        return {r["trial_id"]: dict(r) for r in con.execute("SELECT * FROM trials")}
    finally:
        con.close()


def submissions(ws: Path) -> list[dict]:
    con = sqlite3.connect(f"file:{ws / 'state.db'}?mode=ro", uri=True, timeout=60)
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute("SELECT * FROM submissions ORDER BY created_at")]
    finally:
        con.close()


def wait_for(pred, timeout: float, what: str, every: float = 0.2):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            v = pred()
        except (sqlite3.OperationalError, FileNotFoundError, ValueError):  # db/run dir not there yet
            v = None
        if v:
            return v
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def drivers_done(ws: Path) -> bool:
    subs = submissions(ws)
    return bool(subs) and all(s["state"] in ("done", "crashed", "cancelled") for s in subs)


def expand_ids(dpx, recipe: Path) -> list[dict]:
    r = dpx("expand", str(recipe), "--format", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def attempts_in_log(run_dir: Path) -> int:
    p = run_dir / "log.txt"
    return p.read_text(errors="replace").count("===== attempt") if p.exists() else 0


def loss_steps(run_dir: Path, key: str) -> list[tuple[int, float | None]]:
    out = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        if m["key"] == key:
            out.append((m["step"], m["value"]))
    return out


@pytest.fixture(scope="session")
def mlflow_template(tmp_path_factory) -> Path:
    """An empty MLflow SQLite store made once: creating one runs MLflow's migrations (~10-20 s here); each test
    copies it into its workspace so its driver opens a ready store, as on a second submit."""
    path = tmp_path_factory.mktemp("mlflow_template") / "mlflow.db"
    code = ("from mlflow.tracking import MlflowClient; "
            f"MlflowClient(tracking_uri='sqlite:///{path}').search_experiments()")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=300,
                   env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"})
    return path


def new_ws(tmp_path: Path, template: Path | None = None) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    if template is not None:
        shutil.copy(template, ws / "mlflow.db")
    return ws


def kill_when(ws: Path, tid: str, sig: int, ready, timeout: float = 180) -> int:
    """Send `sig` to the trial's worker process once `ready(row)` holds; return the pid signalled."""
    row = wait_for(lambda: (lambda r: r if r and r["status"] == "running" and r["pid"] and ready(r) else None)(
        trials(ws).get(tid)), timeout, f"trial {tid} running and ready")
    os.kill(row["pid"], sig)
    return row["pid"]


def progressed(row) -> bool:
    """The trial has done at least one step (so it is killed mid-trial, not before it started)."""
    p = Path(row["run_dir"]) / "progress.json"
    return p.exists() and json.loads(p.read_text())["fraction"] > 0


# ---- worker SIGKILL, full disk, blocked run dir, divergence: each fails only its trial ------------------------

FAULTS = """
name: faults
task: {name: debug, steps: 4}
tracking: {enabled: false}
grid:
  - {task.sleep_s: [8.0], task.steps: [8]}     # victim: SIGKILLed mid-trial
  - {task.value: [1.0, 2.0], task.sleep_s: [1.0]}  # bystanders
  - {task.nan_at_step: [2], task.steps: [6]}    # diverges at step 2
  - {task.value: [3.0]}                         # its metrics.jsonl is on a full disk (/dev/full)
  - {task.value: [4.0]}                         # its run dir path is taken by a file
hardware: {max_parallel: 2}
"""


def test_faults_fail_only_their_trial_and_rerun_completes(tmp_path, dpx):
    base = tmp_path / "a[" / "b]"  # error lines quote paths: "[/b]" must print as text, not as rich markup
    base.mkdir(parents=True)
    ws = new_ws(base)
    recipe = tmp_path / "faults.yaml"
    recipe.write_text(FAULTS)
    pts = expand_ids(dpx, recipe)
    by = {}
    for p in pts:
        key = ("victim" if p.get("task.sleep_s") == 8.0 else "nan" if p.get("task.nan_at_step") == 2
               else {1.0: "ok1", 2.0: "ok2", 3.0: "full", 4.0: "blocked"}[p["task.value"]])
        by[key] = p["trial_id"]
    runs = ws / "runs" / "faults"
    (runs / by["full"]).mkdir(parents=True)
    os.symlink("/dev/full", runs / by["full"] / "metrics.jsonl")  # every write: ENOSPC, as on a full disk
    (runs / by["blocked"]).write_text("not a folder")  # mkdir of the run dir fails

    r = dpx("submit", str(recipe), ws=ws)
    assert r.returncode == 0, r.stderr
    kill_when(ws, by["victim"], signal.SIGKILL, progressed)
    wait_for(lambda: drivers_done(ws), 300, "the driver to finish")
    t = trials(ws)
    assert t[by["ok1"]]["status"] == t[by["ok2"]]["status"] == "completed"
    assert all(t[by[k]]["attempts"] == 1 for k in by)

    v = t[by["victim"]]
    assert v["status"] == "failed" and "signal 9" in v["error"], v["error"]
    full = t[by["full"]]
    assert full["status"] == "failed" and "No space left on device" in full["error"], full["error"]
    assert str(runs / by["full"]) in full["error"], full["error"]
    blocked = t[by["blocked"]]
    assert blocked["status"] == "failed" and str(runs / by["blocked"]) in blocked["error"], blocked["error"]
    nan = t[by["nan"]]
    assert nan["status"] == "failed" and "step 2" in nan["error"], nan["error"]
    steps = loss_steps(runs / by["nan"], "loss")
    assert [s for s, _ in steps] == [0, 1, 2] and steps[-1][1] is None  # stopped at the NaN, logged as null

    st = dpx("status", str(recipe), ws=ws)
    assert st.returncode == 0 and "No space left on device" in st.stdout, st.stdout + st.stderr
    assert str(runs / by["blocked"]) in st.stdout and "[dpx] trial" in st.stdout, st.stdout  # error text verbatim

    # clear the obstacles; rerun --failed runs exactly the failed trials again, the completed ones stay put
    (runs / by["full"] / "metrics.jsonl").unlink()
    (runs / by["blocked"]).unlink()
    before = {k: (runs / by[k] / "result.json").read_bytes() for k in ("ok1", "ok2")}
    r = dpx("rerun", str(recipe), "--failed", "--wait", ws=ws, timeout=400)
    t = trials(ws)
    assert {k: t[by[k]]["status"] for k in by} == {
        "victim": "completed", "ok1": "completed", "ok2": "completed", "nan": "failed", "full": "completed",
        "blocked": "completed"}, r.stdout + r.stderr
    assert r.returncode == 1  # the NaN trial diverges again: deterministic
    assert {k: t[by[k]]["attempts"] for k in by} == {"victim": 2, "ok1": 1, "ok2": 1, "nan": 2, "full": 2,
                                                    "blocked": 2}  # an attempt counts from its claim
    assert attempts_in_log(runs / by["blocked"]) == 1  # ... though the blocked one never started the first time
    assert all((runs / by[k] / "result.json").read_bytes() == before[k] for k in before)
    assert attempts_in_log(runs / by["ok1"]) == 1 and attempts_in_log(runs / by["victim"]) == 2


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_unwritable_run_dir_fails_with_path(tmp_path, dpx):
    ws = new_ws(tmp_path)
    recipe = tmp_path / "perm.yaml"
    recipe.write_text("name: perm\ntask: {name: debug, steps: 1}\ntracking: {enabled: false}\n"
                      "grid: {task.value: [1.0, 2.0]}\n")
    pts = expand_ids(dpx, recipe)
    locked = ws / "runs" / "perm" / pts[0]["trial_id"]
    locked.mkdir(parents=True)
    locked.chmod(0o500)
    try:
        r = dpx("submit", str(recipe), "--wait", ws=ws)
        t = trials(ws)
        assert r.returncode == 1
        assert t[pts[0]["trial_id"]]["status"] == "failed" and str(locked) in t[pts[0]["trial_id"]]["error"]
        assert t[pts[1]["trial_id"]]["status"] == "completed"
    finally:
        locked.chmod(0o700)


# ---- worker SIGKILL with retries (local) and on Ray ------------------------------------------------------------

def _ray_backend_available() -> bool:
    try:
        import ray  # noqa: F401

        from dpx.orchestrator.backends.ray import RayBackend  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.parametrize("backend, max_retries", [("local", 1), ("ray", 0), ("ray", 1)])
def test_worker_sigkill_retry_policy(tmp_path, dpx, backend, max_retries):
    if backend == "ray" and not _ray_backend_available():
        pytest.skip("Ray backend not installed")
    ws = new_ws(tmp_path)
    recipe = tmp_path / "kill.yaml"
    ray = "\n  ray: {num_cpus: 2}" if backend == "ray" else ""
    recipe.write_text(f"""
name: kill
task: {{name: debug, steps: 6, sleep_s: 1.0}}
tracking: {{enabled: false}}
grid:
  - {{task.sleep_s: [12.0], task.steps: [12]}}
  - {{task.value: [1.0, 2.0]}}
hardware:
  backend: {backend}
  max_parallel: 2
  max_retries: {max_retries}{ray}
""")
    pts = expand_ids(dpx, recipe)
    victim = next(p["trial_id"] for p in pts if p.get("task.sleep_s") == 12.0)
    others = [p["trial_id"] for p in pts if p["trial_id"] != victim]
    run_dir = ws / "runs" / "kill" / victim
    r = dpx("submit", str(recipe), ws=ws)
    assert r.returncode == 0, r.stderr
    if backend == "local":
        kill_when(ws, victim, signal.SIGKILL, progressed)
    else:  # the Ray worker process that runs the trial (its pid is in the attempt header of the log)
        import re

        def worker_pid():
            row = trials(ws).get(victim)
            if not (row and row["status"] == "running" and progressed(row)):
                return None
            m = re.findall(r"ray worker pid (\d+)", (run_dir / "log.txt").read_text())
            return int(m[-1]) if m else None

        os.kill(wait_for(worker_pid, 240, "the victim's Ray worker"), signal.SIGKILL)
    wait_for(lambda: drivers_done(ws), 400, "the driver to finish")
    t = trials(ws)
    assert all(t[o]["status"] == "completed" and t[o]["attempts"] == 1 for o in others)
    v = t[victim]
    if max_retries:
        assert v["status"] == "completed" and v["attempts"] == 2, v
        assert attempts_in_log(run_dir) == 2
        return
    assert v["status"] == "failed" and v["attempts"] == 1, v
    assert ("worker lost" in v["error"] or "signal 9" in v["error"]), v["error"]
    r = dpx("rerun", str(recipe), "--failed", "--wait", ws=ws, timeout=500)
    assert r.returncode == 0, r.stdout + r.stderr
    t = trials(ws)
    assert t[victim]["status"] == "completed" and t[victim]["attempts"] == 2
    assert all(t[o]["attempts"] == 1 for o in others)


# ---- driver SIGKILL mid-grid --------------------------------------------------------------------------------------

@pytest.mark.slow
def test_driver_sigkill_resume_nothing_lost_or_run_twice(tmp_path, dpx, mlflow_template):
    ws = new_ws(tmp_path, mlflow_template)
    recipe = tmp_path / "grid.yaml"
    n, steps = 8, 4
    recipe.write_text(f"""
name: dk
task: {{name: debug, steps: {steps}, sleep_s: 3.0}}
grid: {{task.value: {[float(i) for i in range(n)]}}}
hardware: {{max_parallel: 2}}
""")
    r = dpx("submit", str(recipe), ws=ws)
    assert r.returncode == 0, r.stderr
    wait_for(lambda: (lambda c: c.count("completed") >= 1 and c.count("running") == 2)(
        [x["status"] for x in trials(ws).values()]), 300, "one trial done and two running")
    sub = submissions(ws)[0]
    os.kill(sub["driver_pid"], signal.SIGKILL)
    t0 = trials(ws)
    done = {k for k, v in t0.items() if v["status"] == "completed"}
    running = {k for k, v in t0.items() if v["status"] == "running"}
    results = {k: (Path(t0[k]["run_dir"]) / "result.json").read_bytes() for k in done}
    st = dpx("status", str(recipe), ws=ws)  # the dead driver is noticed
    assert "no live driver" in st.stdout, st.stdout
    # the orphaned trials keep running without a driver (own sessions); let them finish or not, either is fine

    r = dpx("submit", str(recipe), "--wait", ws=ws, timeout=500)
    assert r.returncode == 0, r.stdout + r.stderr
    t = trials(ws)
    assert len(t) == n and all(v["status"] == "completed" for v in t.values())
    assert all(v["attempts"] == 1 for v in t.values()), {k: v["attempts"] for k, v in t.items()}
    for k, v in t.items():  # no trial ran twice: one attempt in each log, finished results untouched
        assert attempts_in_log(Path(v["run_dir"])) == 1, k
    assert all((Path(t[k]["run_dir"]) / "result.json").read_bytes() == results[k] for k in done)
    assert running  # the kill really hit a grid with trials in flight

    # DuckDB: one row per trial, one metric row per logged point
    q = dpx("query", "SELECT count(*) AS n, count(DISTINCT trial_id) AS d FROM trials WHERE status = 'completed'",
            "--format", "json", ws=ws)
    assert q.returncode == 0, q.stderr
    assert json.loads(q.stdout) == [{"n": n, "d": n}]
    q = dpx("query", "SELECT count(*) AS n FROM metrics WHERE key = 'loss'", "--format", "json", ws=ws)
    assert json.loads(q.stdout) == [{"n": n * steps}]

    # MLflow: one child run per trial, each loss history complete and without duplicates, even after a sync
    s = dpx("sync", ws=ws)
    assert s.returncode == 0, s.stderr
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{ws / 'mlflow.db'}")
    exp = client.get_experiment_by_name("dk")
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    children = [x for x in runs if x.data.tags.get("dpx.kind") == "trial"]
    assert sorted(c.data.tags["dpx.trial_id"] for c in children) == sorted(t)
    for c in children:
        hist = client.get_metric_history(c.info.run_id, "loss")
        assert sorted(m.step for m in hist) == list(range(steps)), c.data.tags["dpx.trial_id"]
        assert c.info.status == "FINISHED"
        assert c.data.metrics.get("final/score") == json.loads(t[c.data.tags["dpx.trial_id"]]["config"])["task"]["value"]


# ---- SIGTERM preemption of a real training trial -----------------------------------------------------------------

WORD = """
name: {name}
task: {{name: word_problem, group: S3, train_len: 8, test_len: 12, val_samples: 32}}
model: {{family: deltaproduct, num_layers: 1, hidden_size: 16, num_heads: 2, vocab_size: 13, num_householder: 2}}
train: {{steps: {steps}, batch_size: 8, lr: 0.003, log_every: 1, eval_every: 0, checkpoint_every: 0,
         precision: fp32, warmup_steps: 2}}
eval: {{batch_size: 32, num_samples: 32}}
grid: {{train.lr: {lrs}}}
tracking: {{enabled: false}}
hardware: {{max_parallel: 2, device: cpu, threads_per_trial: 1}}
"""


def _word_recipe(path: Path, name: str, lrs: list[float], steps: int = 150) -> Path:
    path.write_text(WORD.format(name=name, steps=steps, lrs=lrs))
    return path


@pytest.mark.slow
def test_sigterm_checkpoints_and_resumes_with_a_continuous_loss_curve(tmp_path, dpx):
    """word_problem (a real model, the shared training loop): SIGTERM mid-training → checkpoint, exit 3, requeued
    → the next attempt resumes from the checkpoint; the loss at every step equals an uninterrupted run's.
    A second trial with an absurd learning rate diverges: failed, naming the step, training stopped there."""
    steps = 150
    ws = new_ws(tmp_path)
    recipe = _word_recipe(tmp_path / "pre.yaml", "pre", [0.003, 1.0e30], steps)
    pts = expand_ids(dpx, recipe)
    good = next(p["trial_id"] for p in pts if p["train.lr"] == 0.003)
    bad = next(p["trial_id"] for p in pts if p["train.lr"] != 0.003)
    run_dir = ws / "runs" / "pre" / good
    r = dpx("submit", str(recipe), ws=ws)
    assert r.returncode == 0, r.stderr

    def mid_training(row) -> bool:
        try:
            return len(loss_steps(Path(row["run_dir"]), "train/loss")) >= 10
        except FileNotFoundError:
            return False

    kill_when(ws, good, signal.SIGTERM, mid_training, timeout=300)
    wait_for(lambda: drivers_done(ws), 500, "the driver to finish")
    t = trials(ws)
    g = t[good]
    assert g["status"] == "completed", g
    assert g["attempts"] == 2 and g["preemptions"] == 1, g  # a preemption is not a failure
    log = (run_dir / "log.txt").read_text()
    assert "preempted, checkpoint saved" in log and "resumed from" in log
    curve = loss_steps(run_dir, "train/loss")
    assert [s for s, _ in curve] == list(range(1, steps + 1))  # every step once, across both attempts
    resumed_at = int(log.split("resumed from")[1].split("at step ")[1].split()[0])
    assert 10 <= resumed_at < steps

    b = t[bad]
    assert b["status"] == "failed" and "at step" in b["error"], b
    div_step = int(b["error"].split("at step ")[1].split()[0])
    last = {k: loss_steps(ws / "runs" / "pre" / bad, k)[-1] for k in ("train/loss", "train/grad_norm")}
    assert div_step < steps and all(s == div_step for s, _ in last.values()), last  # stopped at that step
    assert any(v is None for _, v in last.values()), last  # the non-finite value, logged as null

    # the same trial uninterrupted, in another workspace: the same loss at every step (exact resume)
    ws2 = tmp_path / "ws2"
    ref = _word_recipe(tmp_path / "ref.yaml", "pre", [0.003], steps)
    r = dpx("submit", str(ref), "--wait", ws=ws2, timeout=500)
    assert r.returncode == 0, r.stdout + r.stderr
    ref_curve = loss_steps(ws2 / "runs" / "pre" / good, "train/loss")
    assert [s for s, _ in ref_curve] == [s for s, _ in curve]
    for (s, a), (_, b_) in zip(curve, ref_curve):
        assert a == pytest.approx(b_, rel=1e-6, abs=1e-7), f"step {s}: resumed {a} vs uninterrupted {b_}"


# ---- concurrency: two submits at the same moment, queries while trials write -------------------------------------

@pytest.mark.slow
def test_two_submits_at_once_and_queries_while_writing(tmp_path, mlflow_template):
    ws = new_ws(tmp_path, mlflow_template)
    recipe = tmp_path / "cc.yaml"
    n = 16
    recipe.write_text(f"name: cc\ntask: {{name: debug, steps: 3, sleep_s: 0.5}}\n"
                      f"grid: {{task.value: {[float(i) for i in range(n)]}}}\nhardware: {{max_parallel: 2}}\n")
    env = {**os.environ, "DPX_WORKSPACE": str(ws)}
    cmd = [sys.executable, "-m", "dpx.orchestrator.cli"]
    subs = [subprocess.Popen([*cmd, "submit", str(recipe)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in subs]
    for p, (o, e) in zip(subs, outs):
        assert p.returncode == 0, o + e
        assert "locked" not in (o + e).lower() and "Traceback" not in o + e, o + e
    queries = []
    while not drivers_done(ws):
        q = subprocess.run([*cmd, "query", "SELECT status, count(*) AS n FROM trials GROUP BY status",
                            "--format", "json"], capture_output=True, text=True, env=env, timeout=300)
        queries.append(q)
        assert q.returncode == 0 and "locked" not in q.stderr.lower(), q.stderr
        assert sum(row["n"] for row in json.loads(q.stdout)) == n  # every trial, once, at every moment
    assert len(queries) >= 2  # really queried while the grid ran
    t = trials(ws)
    assert len(t) == n and all(v["status"] == "completed" and v["attempts"] == 1 for v in t.values())
    assert all(attempts_in_log(Path(v["run_dir"])) == 1 for v in t.values())
    for log in (ws / "drivers").glob("*.log"):
        text = log.read_text()
        assert "database is locked" not in text and "Traceback" not in text, text[-2000:]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{ws / 'mlflow.db'}")
    exps = [e for e in client.search_experiments() if e.name == "cc"]
    assert len(exps) == 1
    children = [x for x in client.search_runs([exps[0].experiment_id], max_results=1000)
                if x.data.tags.get("dpx.kind") == "trial"]
    assert sorted(c.data.tags["dpx.trial_id"] for c in children) == sorted(t)


# ---- a driver killed between claiming a trial and starting it ----------------------------------------------------

def dead_submission(tmp_path: Path, recipe: Path):
    """A workspace holding one submission "dead" of `recipe`, its trials pending and its driver gone (a pid that
    is no longer alive): what a SIGKILLed driver leaves. Returns (expansion, workspace, open state store)."""
    import socket

    from dpx.orchestrator.state import StateStore
    from dpx.orchestrator.trials import expand
    from dpx.orchestrator.workspace import Workspace

    ex = expand(recipe)
    w = Workspace(tmp_path / "ws").create()
    store = StateStore(w.state_db)
    store.add_submission("dead", ex.recipe, str(recipe), [], "local", ex.trials,
                         lambda t: w.run_dir(ex.recipe, t.trial_id))
    gone = subprocess.Popen(["true"])
    gone.wait()
    store.update_submission("dead", state="running", driver_pid=gone.pid, driver_host=socket.gethostname())
    return ex, w, store


def test_claimed_but_never_started_trial_is_requeued_not_lost(tmp_path, dpx):
    """The state a driver leaves when SIGKILLed right after claiming trials (status running, no process yet).
    The next `dpx submit` must run a claim that never started (its log has no header for that attempt) as if
    nothing happened, and settle one whose attempt did start but whose process is gone as lost."""
    recipe = tmp_path / "claim.yaml"
    recipe.write_text("name: claim\ntask: {name: debug, steps: 1}\ntracking: {enabled: false}\n"
                      "grid: {task.value: [1.0, 2.0, 3.0]}\nhardware: {max_parallel: 2}\n")
    ex, w, store = dead_submission(tmp_path, recipe)
    never, started, untouched = (t.trial_id for t in ex.trials)
    for tid in (never, started):
        assert store.claim("claim", tid, "dead") is not None
    d = w.run_dir("claim", started)
    d.mkdir(parents=True)
    (d / "log.txt").write_text("\n===== attempt 1 2026-01-01 00:00:00 =====\n")  # it started, then vanished
    store.close()

    r = dpx("submit", str(recipe), "--wait", ws=w.root)
    t = trials(w.root)
    assert t[never]["status"] == "completed" and t[never]["attempts"] == 1, t[never]
    assert t[untouched]["status"] == "completed" and t[untouched]["attempts"] == 1
    assert t[started]["status"] == "failed" and "worker lost" in t[started]["error"], t[started]
    assert r.returncode == 1


@pytest.mark.slow
def test_mlflow_run_created_by_a_killed_driver_is_reused_not_duplicated(tmp_path, dpx, mlflow_template):
    """A driver killed between creating a trial's MLflow run (and logging to it) and recording the run id in the
    state store leaves an orphan run; `dpx sync` (and a later driver) must continue that run, not add a second."""
    ws = new_ws(tmp_path, mlflow_template)
    recipe = tmp_path / "orph.yaml"
    recipe.write_text("name: orph\ntask: {name: debug, steps: 3}\ntracking: {enabled: false}\n"
                      "grid: {task.value: [1.0, 2.0]}\n")
    r = dpx("submit", str(recipe), "--wait", ws=ws)
    assert r.returncode == 0, r.stdout + r.stderr
    t = trials(ws)
    a, b = sorted(t)
    from dpx.orchestrator.tracking import Tracker

    tracker = Tracker(f"sqlite:///{ws / 'mlflow.db'}", ws / "mlruns")
    exp = tracker.experiment("orph")
    orphan, _ = tracker.sync_trial(exp, None, t[a], final=False)  # what the killed driver did for trial a
    assert trials(ws)[a]["mlflow_run_id"] is None  # ... and it died before recording the run id

    s = dpx("sync", ws=ws)
    assert s.returncode == 0, s.stdout + s.stderr
    c = tracker.client
    children = [x for x in c.search_runs([exp], max_results=100) if x.data.tags.get("dpx.kind") == "trial"]
    assert sorted(x.data.tags["dpx.trial_id"] for x in children) == [a, b]
    assert trials(ws)[a]["mlflow_run_id"] == orphan
    assert sorted(m.step for m in c.get_metric_history(orphan, "loss")) == [0, 1, 2]  # replayed, not doubled
    assert c.get_run(orphan).info.status == "FINISHED"
