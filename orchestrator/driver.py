"""The driver: a detached process per submission that runs its pending trials on the backend until none is left.

`dpx submit` validates, registers the trials in the state store and starts this process, then returns. The
driver creates the MLflow experiment and parent run first (before any trial starts), then loops: start trials up
to the backend's capacity (claiming each atomically, so a concurrent driver never runs it too), poll for ended
attempts, read their run dir to decide completed / failed / preempted, retry per the recipe, enforce timeouts,
forward metrics to MLflow, and adopt trials whose driver died. Killing it loses nothing: trials run in their own
process groups and the next `dpx submit` of the recipe adopts or re-queues them from the state store.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import traceback
from pathlib import Path

from dpx.rundir import atomic_write_json, read_json

from . import worker
from .backends import Launch, Outcome, make_backend
from .repair import file_id
from .state import StateStore, pid_alive
from .workspace import Workspace

HEARTBEAT_S = 2.0
DEAD_AFTER_S = 30.0  # a driver whose heartbeat is older than this, on another host, is taken for dead
MAX_PREEMPTIONS = 50


def write_run_dir(run_dir: Path, config: dict) -> None:
    """config.json (read by the runner) and config.yaml (for people); written once, when first started."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if not (run_dir / "config.json").exists():
        atomic_write_json(run_dir / "config.json", config)
        try:
            import yaml

            (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        except ImportError:
            pass


def log_tail(run_dir: Path, n: int = 3) -> str:
    try:
        lines = [ln for ln in (Path(run_dir) / "log.txt").read_text(errors="replace").splitlines() if ln.strip()]
        return " | ".join(lines[-n:])[-400:]
    except OSError:
        return ""


def _attempt_started(run_dir: Path, attempt: int) -> bool:
    try:
        return f"===== attempt {attempt} " in (run_dir / "log.txt").read_text(errors="replace")
    except OSError:
        return False


def _ended(run_dir: Path, attempt: int) -> bool:
    """The attempt wrote its result.json or error.json (the runner's last act)."""
    return any((read_json(Path(run_dir) / f) or {}).get("attempt") == attempt for f in ("result.json", "error.json"))


def settle(store: StateStore, row, out: Outcome, reason: str, max_retries: int, timeout_s: float | None) -> str:
    """Decide how an ended attempt ends its trial, from its run dir (result.json / error.json) and how the backend
    saw it end; write that into the state store and return the new status ("pending": requeued, preempted or
    retried under max_retries). Shared by the driver and by `dpx status` / `dpx sync` when no driver is alive."""
    recipe, tid = row["recipe"], row["trial_id"]
    run_dir = Path(row["run_dir"])
    res, err = read_json(run_dir / "result.json"), read_json(run_dir / "error.json")
    attempt = row["attempts"]
    status, error = "failed", None
    if reason == "cancelled":
        status, error = "cancelled", "cancelled by user"
    elif res and res.get("attempt") == attempt and res.get("status") == "completed" and reason != "timeout":
        status = "completed"
    elif reason == "timeout":
        error = f"timed out after {(timeout_s or 0) / 60:g} min (hardware.timeout_min)"
    elif err and err.get("attempt") == attempt and err.get("status") == "preempted":
        status = "preempted"
    elif err and err.get("attempt") == attempt:
        error = err.get("error") or "failed"
    elif not run_dir.is_dir():  # deleted under the running trial: say so, not "exited with code 1"
        error = f"its run dir {run_dir} was deleted while the trial ran (no result could be written)"
    elif reason == "lost":
        error = f"worker lost: {out.detail or 'no result written'}"
    else:
        code = out.exit_code
        sig = f" (signal {-code})" if code is not None and code < 0 else ""
        tail = log_tail(run_dir)
        error = f"exited with code {code}{sig} before writing a result" + (f"; log: {tail}" if tail else "")
    if status == "preempted":
        n = (row["preemptions"] or 0) + 1
        if n <= MAX_PREEMPTIONS:
            store.set_trial(recipe, tid, expect_status="running", status="pending", preemptions=n, owner=None,
                            error="preempted; requeued from checkpoint")
            return "pending"
        status, error = "failed", f"preempted {n} times"
    if status == "failed" and attempt <= max_retries:
        store.set_trial(recipe, tid, expect_status="running", status="pending", owner=None,
                        error=f"attempt {attempt} failed, retrying: {error}"[:1000])
        return "pending"
    store.set_trial(recipe, tid, status=status, ended_at=time.time(), error=error)
    return status


def driver_alive(sub) -> bool:
    if sub is None or sub["state"] not in ("starting", "running", "cancelling"):
        return False
    if sub["driver_host"] == socket.gethostname():
        return pid_alive(sub["driver_pid"])
    return (time.time() - (sub["heartbeat"] or 0)) < DEAD_AFTER_S


class Driver:
    def __init__(self, ws: Workspace, submission_id: str):
        self.ws = ws
        self.sub_id = submission_id
        self.store = StateStore(ws.state_db)
        self.store_file = file_id(ws.state_db)
        sub = self.store.submission(submission_id)
        if sub is None:
            raise SystemExit(f"no submission {submission_id}")
        self.recipe = sub["recipe"]
        rows = self.store.trials(submission=submission_id)
        self.order = [r["trial_id"] for r in rows]
        self.hardware = json.loads(rows[0]["config"]).get("hardware", {}) if rows else {}
        self.tracking = json.loads(rows[0]["config"]).get("tracking", {}) if rows else {}
        self.backend = make_backend(self.hardware, ws)
        self.mine: dict[str, dict] = {}  # trial_id → {"attempt", "started", "timeout_at", "cancel"}
        self.tracker = self.forwarder = None
        self.exp_id = self.parent_id = None
        self.last_forward = 0.0
        self.queue: list[str] = []
        self.queue_at = 0.0
        self.timeout_s = (self.hardware.get("timeout_min") or 0) * 60 or None
        self.max_retries = int(self.hardware.get("max_retries") or 0)

    # ---- MLflow (never fatal: run dirs are the source of truth; `dpx sync` catches up) -----------------------
    def _setup_tracking(self) -> None:
        if self.tracking.get("enabled") is False:
            return
        try:
            from .tracking import Forwarder, Tracker, enable_wal, mlflow_lock

            uri = self.ws.mlflow_uri(self.tracking.get("mlflow_uri"))
            with mlflow_lock(self.ws.root):  # experiment and parent run exist before any trial starts
                self.tracker = Tracker(uri, self.ws.mlflow_artifacts)
                self.exp_id = self.tracker.experiment(self.tracking.get("experiment") or self.recipe)
                enable_wal(uri)
                sub = self.store.submission(self.sub_id)
                self.parent_id = self.tracker.parent_run(self.exp_id, self.sub_id, self.recipe, sub["file"],
                                                         len(self.order))
            self.store.update_submission(self.sub_id, mlflow_experiment_id=self.exp_id,
                                         mlflow_parent_run_id=self.parent_id)
            from .orphans import close_orphan_parents  # parents of killed drivers: closed, or adopted till our end

            self._mlflow(close_orphan_parents, self.store, self.tracker, self.recipe, self.sub_id, True)
            self.forwarder = Forwarder(self.tracker, self.ws.state_db, self.recipe, self.exp_id, self.parent_id)
            self.forwarder.start()
            from .results import unforwarded_of_dead_drivers  # what a killed driver left half-logged

            for tid in unforwarded_of_dead_drivers(self.store, self.recipe, self.sub_id):
                self.forwarder.put("final", tid)
        except Exception as e:  # noqa: BLE001
            print(f"[driver] MLflow unavailable, run dirs only (dpx sync later): {e}", flush=True)
            self.tracker = self.forwarder = None

    def _mlflow(self, fn, *args):
        if self.tracker is None:
            return None
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001
            print(f"[driver] MLflow call failed (dpx sync will retry): {e}", flush=True)
            return None

    # ---- main loop --------------------------------------------------------------------------------------------
    def run(self) -> None:
        # compare-and-set: a `dpx cancel` that came before this driver got here stays `cancelling` (issue 16)
        self.store.update_submission(self.sub_id, expect_state=("starting",), state="running")
        self.store.update_submission(self.sub_id, driver_pid=os.getpid(), driver_host=socket.gethostname(),
                                     heartbeat=time.time())
        self._setup_tracking()
        beat = 0.0
        final_state = "done"
        while True:
            now = time.time()
            if now - beat > HEARTBEAT_S:
                self._check_store()
                sub = self.store.submission(self.sub_id)
                if sub["state"] == "cancelling":
                    self._cancel_all()
                    final_state = "cancelled"
                self.store.update_submission(self.sub_id, heartbeat=now)
                self._adopt_orphans()
                beat = now
            busy = False
            for out in self.backend.poll():
                self._finalize(out)
                busy = True
            self._check_timeouts(now)
            if self.forwarder is not None and now - self.last_forward > 3.0:
                for tid, info in self.mine.items():  # live curves for trials that run long enough to watch
                    if now - info["started"] > 3.0:
                        self.forwarder.put("progress", tid)
                self.last_forward = now
            if final_state != "cancelled":
                busy |= self._start_more()
            if not self.mine and not self._pending_left():
                break
            time.sleep(0.005 if busy else 0.02 if self.mine else 0.1)
        self._close_parent(final_state)
        self.store.update_submission(self.sub_id, state=final_state, ended_at=time.time())
        self.backend.close()
        import resource

        ru = resource.getrusage(resource.RUSAGE_SELF)
        print(f"[driver] {self.sub_id} {final_state}: {len(self.order)} trials; driver CPU "
              f"{ru.ru_utime + ru.ru_stime:.1f} s, max RSS {ru.ru_maxrss // 1024} MiB", flush=True)

    def _refresh_queue(self) -> None:
        """Pending trials of this submission, in grid order (a light query: ids only)."""
        self.queue = [r[0] for r in self.store.q(
            "SELECT t.trial_id FROM trials t JOIN submission_trials s ON s.recipe = t.recipe AND "
            "s.trial_id = t.trial_id WHERE s.submission_id = ? AND t.status = 'pending' ORDER BY s.seq",
            (self.sub_id,))]
        self.queue_at = time.time()

    def _pending_left(self) -> bool:
        # a stale queue can hold trials that were cancelled, settled by another driver or claimed elsewhere since:
        # trusting it would keep this process polling forever (seen after `dpx cancel`)
        if not self.queue or time.time() - self.queue_at > HEARTBEAT_S:
            self._refresh_queue()
        return bool(self.queue)

    def _check_store(self) -> None:
        """state.db deleted or replaced under us: writing on into a file nobody reads would re-run or lose trials
        (issue 16), so stop as if killed; the trials run on, the next command rebuilds the store from the run
        dirs and `dpx submit` adopts them."""
        if file_id(self.ws.state_db) != self.store_file:
            print(f"[driver] {self.ws.state_db} was deleted or replaced while this driver ran; stopping as if "
                  "killed (its trials run on; `dpx submit` adopts them)", flush=True)
            os._exit(3)

    def _start_more(self) -> bool:
        started = False
        if self.backend.capacity() <= 0:
            return False
        self._check_store()  # before claiming: a claim made into a deleted store would run the trial twice
        if not self.queue or time.time() - self.queue_at > HEARTBEAT_S:
            self._refresh_queue()  # picks up trials requeued by retries, preemption or `rerun`
        while self.queue and self.backend.capacity() > 0:
            tid = self.queue.pop(0)
            claimed = self.store.claim(self.recipe, tid, self.sub_id)
            if claimed is None:
                continue
            self._launch(claimed)
            started = True
        if started:
            for tid, handle in self.backend.flush().items():
                self.store.set_trial(self.recipe, tid, backend_job_id=handle)
        return started

    def _launch(self, row) -> None:
        tid, run_dir = row["trial_id"], Path(row["run_dir"])
        try:
            write_run_dir(run_dir, json.loads(row["config"]))
        except OSError as e:  # disk full / permission: fail this trial with the path, the grid goes on
            self.store.set_trial(self.recipe, tid, status="failed", ended_at=time.time(),
                                 error=f"cannot write run dir {run_dir}: {e.strerror or e}")
            return
        if row["mlflow_run_id"] and self.forwarder is not None:  # a new attempt continues the trial's MLflow run
            self.store.set_trial(self.recipe, tid, mlflow_done=0)
            self.forwarder.put("restart", tid)
        launch = Launch(self.recipe, tid, run_dir, row["attempts"], json.loads(row["config"]))
        try:
            handle = self.backend.start(launch)
        except Exception as e:  # noqa: BLE001
            self.store.set_trial(self.recipe, tid, status="failed", ended_at=time.time(),
                                 error=f"backend could not start the trial: {type(e).__name__}: {e}"[:500])
            return
        self.store.set_trial(self.recipe, tid, pid=int(handle) if handle.isdigit() else None, backend_job_id=handle)
        self.mine[tid] = {"attempt": row["attempts"], "started": time.time(), "reason": None}

    def _finalize(self, out: Outcome) -> None:
        info = self.mine.pop(out.trial_id, None)
        rows = self.store.q("SELECT * FROM trials WHERE recipe = ? AND trial_id = ?", (self.recipe, out.trial_id))
        if not rows:
            return
        reason = (info or {}).get("reason") or out.reason
        status = settle(self.store, rows[0], out, reason, self.max_retries, self.timeout_s)
        if status in ("completed", "failed", "cancelled") and self.forwarder is not None:
            self.forwarder.put("final", out.trial_id)

    def _check_timeouts(self, now: float) -> None:
        if not self.timeout_s:
            return
        for tid, info in self.mine.items():
            if info["reason"] is None and now - info["started"] > self.timeout_s:
                info["reason"] = "timeout"
                self.backend.cancel(self.recipe, tid, "timeout")

    def _cancel_all(self) -> None:
        self.queue = []  # nothing more starts; the pending trials are cancelled below
        for tid, info in self.mine.items():
            if info["reason"] is None:
                info["reason"] = "cancelled"
                self.backend.cancel(self.recipe, tid, "cancelled")
        with self.store.tx() as c:
            c.execute("UPDATE trials SET status = 'cancelled', error = 'cancelled by user', updated_at = ? "
                      "WHERE recipe = ? AND status = 'pending' AND trial_id IN "
                      "(SELECT trial_id FROM submission_trials WHERE submission_id = ?)",
                      (time.time(), self.recipe, self.sub_id))

    def _adopt_orphans(self) -> None:
        """Running trials of this recipe whose driver is gone: watch them if they still run, else settle them."""
        self._check_unregistered()
        for row in self.store.trials(recipe=self.recipe, status="running"):
            if row["owner"] == self.sub_id or row["trial_id"] in self.mine:
                continue
            if driver_alive(self.store.submission(row["owner"]) if row["owner"] else None):
                continue
            owner = self.store.set_trial(self.recipe, row["trial_id"], expect_status="running", owner=self.sub_id)
            if not owner:
                continue
            tid, run_dir, attempt = row["trial_id"], Path(row["run_dir"]), row["attempts"]
            handle = row["backend_job_id"] or str(row["pid"] or "")
            if self.backend.name == "local" and handle in ("", "None"):
                if not _attempt_started(run_dir, attempt):
                    # claimed, but its driver died before starting it (the local backend writes the attempt
                    # header before it spawns): not an attempt, so back to the queue instead of failing as "lost"
                    self.store.set_trial(self.recipe, tid, expect_status="running", status="pending",
                                         owner=None, attempts=max(0, attempt - 1))
                    continue
                # started, but its driver died before recording the pid: the worker registers itself in the run
                # dir (worker.py); until it has, or its grace is over, the attempt is unknown, not lost
                w = worker.registered(run_dir, attempt)
                if w is None and not _ended(run_dir, attempt):
                    since = worker.header_time(run_dir, attempt) or row["started_at"] or time.time()
                    self.mine[tid] = {"attempt": attempt, "started": row["started_at"] or time.time(),
                                      "reason": None, "register_by": since + worker.REGISTER_GRACE_S}
                    continue
                if w is not None and w.get("host") == socket.gethostname() and worker.alive(w):
                    handle = str(w["pid"])
                    self.store.set_trial(self.recipe, tid, pid=int(w["pid"]), backend_job_id=handle)
            self._watch_adopted(tid, run_dir, attempt, handle, row["started_at"])

    def _watch_adopted(self, tid: str, run_dir: Path, attempt: int, handle: str, started: float | None) -> None:
        reason = (self.mine.get(tid) or {}).get("reason")  # a cancel or timeout decided while it was unknown
        self.mine[tid] = {"attempt": attempt, "started": started or time.time(), "reason": reason}
        if not self.backend.adopt(self.recipe, tid, handle, run_dir, attempt):
            self._finalize(Outcome(self.recipe, tid, attempt, None, "lost", "its driver died and the process is gone"))
        elif reason:
            self.backend.cancel(self.recipe, tid, reason)

    def _check_unregistered(self) -> None:
        """Adopted attempts that had not registered their worker yet: adopt the worker once it has; settle them
        from the run dir if they already ended; lost once the grace is over with no worker."""
        for tid, info in list(self.mine.items()):
            if "register_by" not in info:
                continue
            rows = self.store.q("SELECT run_dir FROM trials WHERE recipe = ? AND trial_id = ?", (self.recipe, tid))
            run_dir = Path(rows[0]["run_dir"]) if rows else None
            w = worker.registered(run_dir, info["attempt"]) if run_dir else None
            if w is not None and w.get("host") == socket.gethostname() and worker.alive(w):
                self.store.set_trial(self.recipe, tid, pid=int(w["pid"]), backend_job_id=str(w["pid"]))
                self._watch_adopted(tid, run_dir, info["attempt"], str(w["pid"]), info["started"])
            elif w is not None or run_dir is None or _ended(run_dir, info["attempt"]):
                self._watch_adopted(tid, run_dir, info["attempt"], "", info["started"])  # ended: from the run dir
            elif time.time() > info["register_by"]:
                self.mine.pop(tid)
                self._finalize(Outcome(self.recipe, tid, info["attempt"], None, "lost",
                                       f"its driver died before recording its pid and no worker registered "
                                       f"within {worker.REGISTER_GRACE_S:g} s"))

    def _close_parent(self, state: str) -> None:
        if self.tracker is None or self.parent_id is None:
            return
        self.forwarder.close()
        figures = []
        try:  # recipe-level figures (Fig. 4/5/8/9, tables) from the registry, logged on the parent run
            from dpx.registry.plots import write_plots

            from .results import refresh_duckdb

            db = refresh_duckdb(self.ws, force=True)
            figures = write_plots(db, self.ws.runs / self.recipe / "_figures", self.recipe)
        except Exception as e:  # noqa: BLE001 — figures are a nicety; the results are in the run dirs
            print(f"[driver] no recipe figures: {type(e).__name__}: {e}", flush=True)
        from mlflow.entities import Metric

        counts = self.store.counts(submission=self.sub_id)
        self._mlflow(self.tracker.client.log_batch, self.parent_id,
                     [Metric(f"trials_{k}", v, int(time.time() * 1000), 0) for k, v in counts.items()])
        status = "FINISHED" if counts["failed"] == 0 and state == "done" else (
            "KILLED" if state == "cancelled" else "FAILED")
        self._mlflow(self.tracker.end_parent, self.parent_id, status, figures)
        from .orphans import close_orphan_parents  # the ones we adopted: closed as their trials ended

        self._mlflow(close_orphan_parents, self.store, self.tracker, self.recipe, self.sub_id, False)


def spawn_driver(ws: Workspace, submission_id: str) -> int:
    """Start a detached driver process (own session: it outlives the CLI and the terminal)."""
    import subprocess

    log = open(ws.drivers / f"{submission_id}.log", "ab")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen([sys.executable, "-m", "dpx.orchestrator.driver", "--workspace", str(ws.root),
                          "--submission", submission_id], stdout=log, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL, start_new_session=True, env=env)
    log.close()
    return p.pid


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dpx.orchestrator.driver")
    ap.add_argument("--workspace", required=True)
    ap.add_argument("--submission", required=True)
    a = ap.parse_args(argv)
    ws = Workspace.resolve(a.workspace)
    from .turns import cancel_waiting, finish_if_nothing_left, wait_turn  # one driver per recipe (turns.py)

    if not wait_turn(StateStore(ws.state_db), a.submission):
        cancel_waiting(StateStore(ws.state_db), a.submission)
        return 0
    if finish_if_nothing_left(StateStore(ws.state_db), a.submission):  # the earlier driver ran them all
        print(f"[driver] {a.submission}: every trial was run by the recipe's earlier driver; nothing left", flush=True)
        return 0
    d = Driver(ws, a.submission)
    try:
        d.run()
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        print(f"[driver] crashed: {type(e).__name__}: {' '.join(str(e).split())[:300]}", flush=True)
        try:
            d.store.update_submission(a.submission, state="crashed", ended_at=time.time())
        except Exception as e2:  # noqa: BLE001 — a full disk: `dpx status` still sees the driver is dead
            print(f"[driver] could not record the crash either: {e2}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
