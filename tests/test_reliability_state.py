"""The state store under races and damage (issue 16): every status change is a compare-and-set in one
transaction, so a `dpx cancel` that lands before the driver's first write is never overwritten; a deleted,
emptied or truncated state.db is rebuilt from the run dirs (`dpx repair`, or at `submit`) and a completed trial
is never run again."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from test_reliability_faults import attempts_in_log, mlflow_template, submissions, trials  # noqa: F401 (fixture)


def _recipe(tmp_path: Path, n: int, name: str = "race", steps: int = 0) -> Path:
    p = tmp_path / f"{name}.yaml"
    p.write_text(f"name: {name}\ntask: {{name: debug, steps: {steps}}}\ngrid: {{task.value: {list(range(n))}}}\n")
    return p


def test_set_trial_is_compare_and_set(tmp_path):
    from dpx.orchestrator.state import StateStore
    from dpx.orchestrator.trials import expand

    ex = expand(_recipe(tmp_path, 1))
    store = StateStore(tmp_path / "state.db")
    store.add_submission("s1", ex.recipe, "f", [], "local", ex.trials, lambda t: tmp_path / t.trial_id)
    tid = ex.trials[0].trial_id
    assert store.set_trial(ex.recipe, tid, status="cancelled")  # pending -> cancelled
    assert not store.set_trial(ex.recipe, tid, status="completed")  # a late completion never overwrites it
    assert not store.claim(ex.recipe, tid, "other")
    assert store.q("SELECT status FROM trials")[0][0] == "cancelled"
    assert store.set_trial(ex.recipe, tid, status="pending")  # rerun
    assert store.claim(ex.recipe, tid, "me")
    assert store.set_trial(ex.recipe, tid, status="completed")
    assert not store.set_trial(ex.recipe, tid, status="failed")  # completed is final
    assert not store.set_trial(ex.recipe, tid, status="cancelled")
    assert store.q("SELECT status FROM trials")[0][0] == "completed"
    store.update_submission("s1", expect_state=("starting", "running"), state="cancelling")
    assert not store.update_submission("s1", expect_state=("starting",), state="running")
    assert store.submission("s1")["state"] == "cancelling"


def test_cancel_before_the_driver_starts_is_not_overwritten(tmp_path, dpx):
    """`dpx cancel` lands between `submit` registering the submission and its driver's first write (the race of
    a cancel 0.2 s after submit, made deterministic: the driver starts after the cancel). The driver once wrote
    `running` over `cancelling` and ran all 20 trials; now none runs and the submission ends cancelled."""
    from dpx.orchestrator.state import StateStore
    from dpx.orchestrator.trials import expand
    from dpx.orchestrator.workspace import Workspace

    ws = Workspace.resolve(tmp_path / "ws").create()
    recipe = _recipe(tmp_path, 20)
    ex = expand(recipe)
    store = StateStore(ws.state_db)
    store.add_submission("sub-race", ex.recipe, str(recipe), [], "local", ex.trials,
                         lambda t: ws.run_dir(ex.recipe, t.trial_id))  # what `dpx submit` does before the driver
    r = dpx("cancel", "race", ws=ws.root)
    assert r.returncode == 0 and "cancelled" in r.stdout, r.stderr
    assert store.submission("sub-race")["state"] == "cancelling"
    p = subprocess.run([sys.executable, "-m", "dpx.orchestrator.driver", "--workspace", str(ws.root),
                        "--submission", "sub-race"], capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "DPX_FORKSERVER": "0"})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    t = trials(ws.root)
    assert {v["status"] for v in t.values()} == {"cancelled"} and len(t) == 20
    assert all(v["attempts"] == 0 for v in t.values())
    assert sum(attempts_in_log(ws.run_dir("race", tid)) for tid in t) == 0
    assert [s["state"] for s in submissions(ws.root)] == ["cancelled"]


def _child_runs(ws: Path, exp: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{ws / 'mlflow.db'}")
    e = client.get_experiment_by_name(exp)
    return client.search_runs([e.experiment_id], filter_string="tags.`dpx.kind` = 'trial'", max_results=1000)


def _one_line_repair(r) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout[-1000:], r.stderr[-1000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "dpx repair" in lines[0] and "Traceback" not in r.stderr, r.stderr


def test_lost_state_store_rebuilt_from_run_dirs(tmp_path, dpx, mlflow_template):  # noqa: F811
    """state.db deleted, emptied, truncated to half, overwritten: a completed trial is never run again and never
    gets a second MLflow child run. Deleted: the next command rebuilds it from the run dirs. Damaged: `status`,
    `query`, `submit` say in one line to run `dpx repair` (exit 2, nothing run); `dpx repair` keeps the damaged
    file aside, rebuilds the store, and MLflow's child runs are found again by their tag, not duplicated. Once a
    `submit` into a fresh store counted all trials "new" and re-ran every one (80 child runs for 40 trials)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    import shutil

    shutil.copy(mlflow_template, ws / "mlflow.db")
    recipe = _recipe(tmp_path, 6, name="lost")
    r = dpx("submit", str(recipe), "--wait", ws=ws, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    ids = set(trials(ws))
    assert len(ids) == 6 and len(_child_runs(ws, "lost")) == 6

    def unchanged():
        t = trials(ws)
        assert set(t) == ids and {v["status"] for v in t.values()} == {"completed"}
        assert all(attempts_in_log(ws / "runs" / "lost" / tid) == 1 for tid in ids)  # ran once, all told
        runs = _child_runs(ws, "lost")
        assert len(runs) == 6 and len({x.data.tags["dpx.trial_id"] for x in runs}) == 6

    def rm_store():
        for s in ("", "-wal", "-shm"):
            Path(f"{ws / 'state.db'}{s}").unlink(missing_ok=True)

    # 1. deleted: rebuilt by the next command; submit runs nothing
    rm_store()
    r = dpx("submit", str(recipe), ws=ws)
    assert r.returncode == 0 and "0 to run" in r.stdout, r.stdout + r.stderr
    unchanged()
    r = dpx("sync", ws=ws)
    assert r.returncode == 0, r.stderr
    unchanged()

    # 2. emptied, 3. truncated to half, 4. overwritten by other bytes: one line, then `dpx repair`
    def empty():
        rm_store()
        (ws / "state.db").write_bytes(b"")

    def half():
        data = (ws / "state.db").read_bytes()
        rm_store()
        (ws / "state.db").write_bytes(data[: len(data) // 2])

    def garbage():
        rm_store()
        (ws / "state.db").write_text("x\n")

    for damage in (empty, half, garbage):
        dpx("status", ws=ws)  # checkpoints the WAL into state.db so that `half` cuts real pages
        damage()
        every = (("status",), ("query", "SELECT 1"), ("submit", str(recipe)), ("cancel", "lost"))
        for args in every if damage is half else every[:1]:
            _one_line_repair(dpx(*args, ws=ws))
        r = dpx("repair", ws=ws)
        assert r.returncode == 0 and "6 trial(s) rebuilt" in r.stdout and "6 completed" in r.stdout, \
            r.stdout + r.stderr
        assert list(ws.glob("state.db.damaged-*")), damage.__name__
        r = dpx("submit", str(recipe), ws=ws)
        assert r.returncode == 0 and "0 to run" in r.stdout, r.stdout + r.stderr
        unchanged()
        for p in ws.glob("state.db.damaged-*"):
            p.unlink()


def test_submit_adopts_trials_whose_run_dir_says_completed(tmp_path):
    """A trial new to the store (its row lost) whose run dir holds its completed result.json is registered as
    completed by add_submission, never pending (unit level, real SQLite and run dirs)."""
    import json

    from dpx.orchestrator.state import StateStore
    from dpx.orchestrator.trials import expand

    ex = expand(_recipe(tmp_path, 3, name="adopt"))
    done = ex.trials[0]
    d = tmp_path / "runs" / done.trial_id
    d.mkdir(parents=True)
    (d / "result.json").write_text(json.dumps({"trial_id": done.trial_id, "status": "completed", "attempt": 2,
                                               "metrics": {"score": 1.0}, "started_at": 1.0, "ended_at": 2.0}))
    other = tmp_path / "runs" / ex.trials[1].trial_id  # a result of another trial id: not adopted
    other.mkdir(parents=True)
    (other / "result.json").write_text(json.dumps({"trial_id": "someoneelse", "status": "completed"}))
    store = StateStore(tmp_path / "state.db")
    store.add_submission("s", ex.recipe, "f", [], "local", ex.trials, lambda t: tmp_path / "runs" / t.trial_id)
    got = {r["trial_id"]: (r["status"], r["attempts"]) for r in store.trials()}
    assert got[done.trial_id] == ("completed", 2)
    assert got[ex.trials[1].trial_id] == ("pending", 0) and got[ex.trials[2].trial_id] == ("pending", 0)


def test_launched_attempt_without_worker_is_rebuilt_running(tmp_path):
    """The store lost in the instant after the backend started an attempt (its header is in log.txt) and before
    its worker wrote worker.json: the rebuilt trial is running (registering), not pending, so the next driver adopts
    it instead of starting it a second time (issue 16). Retries and Slurm's repeated headers read right."""
    import json

    from dpx.orchestrator.rundir_state import run_dir_state

    d = tmp_path / "t"
    d.mkdir()
    (d / "log.txt").write_text("\n===== attempt 1 2026-12-01 10:00:00 =====\n")
    st = run_dir_state(d, "t")
    assert st["status"] == "running" and st["pid"] is None and st["attempts"] == 1 and st["started_at"]
    (d / "worker.json").write_text(json.dumps({"attempt": 1, "pid": 4242, "host": "h", "time": 5.0}))
    assert run_dir_state(d, "t")["pid"] == 4242  # registered: adopted by its pid
    (d / "error.json").write_text(json.dumps({"trial_id": "t", "status": "failed", "error": "boom", "attempt": 1}))
    assert run_dir_state(d, "t")["status"] == "failed"
    with open(d / "log.txt", "a") as f:  # the retry started, not registered yet
        f.write("\n===== attempt 2 2026-12-01 10:01:00 =====\n")
    st = run_dir_state(d, "t")
    assert st["status"] == "running" and st["attempts"] == 2 and st["pid"] is None
    e = tmp_path / "requeued"  # Slurm requeued attempt 1 (a second header of the same number), worker registered
    e.mkdir()
    (e / "log.txt").write_text("\n===== attempt 1 2026-12-01 10:00:00 on n2 =====\n"
                               "\n===== attempt 1 2026-12-01 10:02:00 on n1 =====\n")
    (e / "worker.json").write_text(json.dumps({"attempt": 1, "pid": 77, "host": "n1", "time": 6.0}))
    assert run_dir_state(e, "requeued")["pid"] == 77


def test_run_dir_deleted_while_the_trial_runs_says_so(tmp_path, dpx):
    """The run dir removed under a running trial: the trial fails with "its run dir ... was deleted while the
    trial ran", not "exited with code 1 before writing a result"; the other trial completes."""
    import shutil

    from test_reliability_faults import wait_for

    ws = tmp_path / "ws"
    p = tmp_path / "gone.yaml"
    p.write_text("name: gone\ntask: {name: debug, steps: 20, sleep_s: 6}\ngrid: {task.value: [1, 2]}\n"
                 "hardware: {cpus_per_trial: 1}\n")
    r = dpx("submit", str(p), ws=ws)
    assert r.returncode == 0, r.stderr
    row = wait_for(lambda: next((v for v in trials(ws).values() if v["status"] == "running" and v["pid"]
                                 and (Path(v["run_dir"]) / "metrics.jsonl").exists()), None), 180, "a running trial")
    shutil.rmtree(row["run_dir"])
    wait_for(lambda: all(v["status"] in ("completed", "failed") for v in trials(ws).values()), 240, "both trials")
    t = trials(ws)
    assert t[row["trial_id"]]["status"] == "failed"
    assert "was deleted while the trial ran" in t[row["trial_id"]]["error"], t[row["trial_id"]]["error"]
    assert [v["status"] for k, v in t.items() if k != row["trial_id"]] == ["completed"]


def test_next_driver_finishes_forwarding_a_killed_driver_left(tmp_path, dpx, mlflow_template):  # noqa: F811
    """What a driver SIGKILLed while it still forwards finished trials to MLflow leaves: trials completed in the
    store with mlflow_done = 0 and a part of their points logged, their child runs RUNNING, the submission
    `running` under a dead pid, its parent run RUNNING. The next `dpx submit` (a grown grid) logs the rest of
    each trial into its existing child run and finishes it, and closes the dead parent, without `dpx sync`
    (the new driver once never logged them)."""
    import shutil
    import sqlite3

    from mlflow.tracking import MlflowClient

    ws = tmp_path / "ws"
    ws.mkdir()
    shutil.copy(mlflow_template, ws / "mlflow.db")
    p = tmp_path / "fwd.yaml"
    p.write_text("name: fwd\ntask: {name: debug, steps: 5}\ngrid: {task.value: [1, 2, 3, 4]}\n")
    r = dpx("submit", str(p), "--wait", ws=ws, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{ws / 'mlflow.db'}")
    runs = {x.data.tags["dpx.trial_id"]: x for x in _child_runs(ws, "fwd")}
    assert len(runs) == 4
    parent = submissions(ws)[0]["mlflow_parent_run_id"]
    # the kill: 3 trials half-forwarded (child RUNNING, offset 0), the driver gone, its parent RUNNING
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    half = sorted(runs)[:3]
    con = sqlite3.connect(ws / "state.db")
    with con:
        con.execute(f"UPDATE trials SET mlflow_done = 0, mlflow_offset = 0 WHERE trial_id IN "
                    f"({','.join('?' for _ in half)})", half)
        con.execute("UPDATE submissions SET state = 'running', driver_pid = ?, ended_at = NULL", (dead.pid,))
    con.close()
    for tid in half:
        client.update_run(runs[tid].info.run_id, "RUNNING")
    client.update_run(parent, "RUNNING")

    p.write_text("name: fwd\ntask: {name: debug, steps: 5}\ngrid: {task.value: [1, 2, 3, 4, 5]}\n")
    r = dpx("submit", str(p), "--wait", ws=ws, timeout=600)
    assert r.returncode == 0 and "1 new" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    after = {x.data.tags["dpx.trial_id"]: x for x in _child_runs(ws, "fwd")}
    assert len(after) == 5  # one child run per trial: the 3 reused, not duplicated
    for tid in half:
        assert after[tid].info.run_id == runs[tid].info.run_id and after[tid].info.status == "FINISHED", tid
        hist = client.get_metric_history(after[tid].info.run_id, "loss")
        assert sorted(m.step for m in hist) == sorted({m.step for m in hist}), "a duplicated point"
    assert client.get_run(parent).info.status != "RUNNING"
    assert all(v["mlflow_done"] == 1 for v in trials(ws).values())
    assert all(attempts_in_log(Path(v["run_dir"])) == 1 for v in trials(ws).values())


def test_full_disk_is_one_line_and_the_store_stays_readable(tmp_path, dpx):
    """A workspace on a filesystem that fills (a real 16 MB tmpfs; root only): after the disk is full, `status`
    reads the store, `query` answers from the last DuckDB build with a note, and a `submit` that must write says
    "the disk is full" in one line (the real error, not "cannot rollback"), no traceback; nothing is lost once
    space is freed."""
    import os
    import subprocess as sp

    import pytest

    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if os.geteuid() != 0 or sp.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)]).returncode:
        pytest.skip("needs root to mount a small tmpfs")
    try:
        ws = mnt / "ws"
        p = tmp_path / "full.yaml"
        p.write_text("name: full\ntask: {name: debug, steps: 2}\ngrid: {task.value: [1, 2]}\n"
                     "tracking: {enabled: false}\n")
        r = dpx("submit", str(p), "--wait", ws=ws, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        q = dpx("query", "SELECT count(*) AS n FROM trials", "--format", "json", ws=ws)
        assert q.returncode == 0 and '"n": 2' in q.stdout, q.stderr
        metrics = ws / "runs" / "full" / next(iter(trials(ws))) / "metrics.jsonl"
        fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT)  # fill the disk to the last byte
        for size in (1 << 16, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
        os.close(fd)
        r = dpx("status", ws=ws)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        # a run dir changed (mtime): query wants a rebuild, cannot write it, answers from the last build
        os.utime(metrics)
        q = dpx("query", "SELECT count(*) AS n FROM trials", "--format", "json", ws=ws)
        assert q.returncode == 0 and '"n": 2' in q.stdout and "could not be rebuilt" in q.stderr, q.stderr
        p.write_text("name: full\ntask: {name: debug, steps: 2}\ngrid: {task.value: " + str(list(range(3, 400)))
                     + "}\ntracking: {enabled: false}\n")
        r = dpx("submit", str(p), ws=ws)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and len(lines) == 1 and "disk is full" in lines[0], r.stderr
        assert "rollback" not in r.stderr
        (mnt / "filler").unlink()
        t = trials(ws)
        assert len(t) == 2 and {v["status"] for v in t.values()} == {"completed"}
        r = dpx("status", ws=ws)
        assert r.returncode == 0, r.stderr
    finally:
        sp.run(["umount", "-l", str(mnt)])


def test_state_db_deleted_under_a_live_driver(tmp_path, dpx):
    """state.db deleted mid-grid: the live driver notices within a heartbeat and stops as if killed (it once went
    on writing into the deleted file, re-ran completed trials and died); its trials run on. The next command
    rebuilds the store from the run dirs, `dpx submit` adopts the running trials and runs the rest: every trial
    completes and ran exactly once."""
    from dpx.orchestrator.trial.worker import pid_alive
    from test_reliability_faults import wait_for

    ws = tmp_path / "ws"
    p = tmp_path / "del.yaml"
    p.write_text("name: del\ntask: {name: debug, steps: 4, sleep_s: 3}\ngrid: {task.value: [1, 2, 3, 4, 5, 6, 7, 8]}\n"
                 "hardware: {cpus_per_trial: 1}\ntracking: {enabled: false}\n")
    r = dpx("submit", str(p), ws=ws)
    assert r.returncode == 0, r.stderr
    wait_for(lambda: sum(v["status"] == "completed" for v in trials(ws).values()) >= 2
             and any(v["status"] == "running" for v in trials(ws).values()), 300, "2 completed, 1 running")
    drv = submissions(ws)[0]
    for s in ("", "-wal", "-shm"):
        Path(f"{ws / 'state.db'}{s}").unlink(missing_ok=True)
    wait_for(lambda: not pid_alive(drv["driver_pid"]), 60, "the driver to stop")
    assert "deleted or replaced" in (ws / "drivers" / f"{drv['id']}.log").read_text()
    r = dpx("status", ws=ws)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    r = dpx("submit", str(p), "--wait", ws=ws, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    t = trials(ws)
    assert len(t) == 8 and {v["status"] for v in t.values()} == {"completed"}, {k: v["status"] for k, v in t.items()}
    assert [attempts_in_log(Path(v["run_dir"])) for v in t.values()] == [1] * 8  # each ran once, all told


def test_a_store_that_stays_locked_raises_and_writes_nothing(tmp_path, monkeypatch):
    """A writer that never lets go: tx must fail loudly after its retries, never run its body outside a
    transaction (it used to fall through after the last retry and write without one)."""
    import sqlite3

    from dpx.orchestrator.state import StateStore

    ex_path = tmp_path / "state.db"
    store = StateStore(ex_path)
    monkeypatch.setattr(StateStore, "BUSY_TRIES", 3)
    store.conn.execute("PRAGMA busy_timeout = 20")
    other = sqlite3.connect(str(ex_path), isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    ran = []
    try:
        try:
            with store.tx() as c:
                ran.append(1)
                c.execute("INSERT INTO events (time, kind) VALUES (0, 'x')")
        except RuntimeError as e:
            assert "stayed locked" in str(e) and str(ex_path) in str(e)
        else:
            raise AssertionError("tx on a locked store did not raise")
        assert not ran
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert store.q("SELECT COUNT(*) FROM events")[0][0] == 0
    with store.tx() as c:  # once the lock goes, the store works again
        c.execute("INSERT INTO events (time, kind) VALUES (0, 'x')")
    assert store.q("SELECT COUNT(*) FROM events")[0][0] == 1
