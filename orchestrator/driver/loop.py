"""The driver's main loop (`Driver.run`), in the driver process (process.py starts it): start trials up to the
backend's capacity (claiming each atomically, so a concurrent driver never runs it too), poll for ended attempts,
settle them (retry.py), enforce timeouts, forward metrics to MLflow, adopt trials whose driver died (adoption.py)
and, at the end, close the MLflow parent run (parents.py) with the recipe's figures. Killing it loses nothing:
trials run in their own process groups and the next `dpx submit` of the recipe adopts or re-queues them.
"""
from __future__ import annotations

import json
import os
import resource
import socket
import time
from pathlib import Path

from .. import sync
from ..backends import Launch, Outcome, make_backend
from ..hardware import HardwareConfig
from ..state import StateStore, file_id
from ..tracking import Forwarder, Tracker, enable_wal, mlflow_lock
from ..tracking_config import TrackingConfig
from ..trial import worker
from ..workspace import Workspace
from .adoption import local_attempt, register_deadline
from .attempts import write_run_dir
from .liveness import HEARTBEAT_S, driver_alive
from .parents import close_orphan_parents, close_parent
from .retry import settle


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
        config = json.loads(rows[0]["config"]) if rows else {}
        self.hardware = HardwareConfig.of(config)
        self.tracking = TrackingConfig.of(config)
        self.backend = make_backend(self.hardware, ws)
        self.mine: dict[str, dict] = {}  # trial_id → {"attempt", "started", "timeout_at", "cancel"}
        self.tracker = self.forwarder = None
        self.exp_id = self.parent_id = None
        self.last_forward = 0.0
        self.queue: list[str] = []
        self.queue_at = 0.0
        self.timeout_s = self.hardware.timeout_s
        self.max_retries = self.hardware.max_retries
        self.ws_limit = self.backend.workspace_limit()  # max_parallel holds per workspace (every recipe's trials)

    # ---- MLflow (never fatal: run dirs are the source of truth; `dpx sync` catches up) -----------------------
    def _setup_tracking(self) -> None:
        if not self.tracking.enabled:
            return
        try:
            uri = self.ws.mlflow_uri(self.tracking.mlflow_uri)
            with mlflow_lock(self.ws.root):  # experiment and parent run exist before any trial starts
                self.tracker = Tracker(uri, self.ws.mlflow_artifacts)
                self.exp_id = self.tracker.experiment(self.tracking.experiment or self.recipe)
                enable_wal(uri)
                sub = self.store.submission(self.sub_id)
                self.parent_id = self.tracker.parent_run(self.exp_id, self.sub_id, self.recipe, sub["file"],
                                                         len(self.order))
            self.store.update_submission(self.sub_id, mlflow_experiment_id=self.exp_id,
                                         mlflow_parent_run_id=self.parent_id)
            # parents of killed drivers: closed, or adopted till our end
            self._mlflow(close_orphan_parents, self.store, self.tracker, self.recipe, self.sub_id, True)
            self.forwarder = Forwarder(self.tracker, self.ws.state_db, self.recipe, self.exp_id, self.parent_id)
            self.forwarder.start()
            for tid in sync.unforwarded_of_dead_drivers(self.store, self.recipe, self.sub_id):
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
        ru = resource.getrusage(resource.RUSAGE_SELF)
        print(f"[driver] {self.sub_id} {final_state}: {len(self.order)} trials; driver CPU "
              f"{ru.ru_utime + ru.ru_stime:.1f} s, max RSS {ru.ru_maxrss // 1024} MiB", flush=True)

    def _refresh_queue(self) -> None:
        """Pending trials of this submission, in grid order (a light query: ids only)."""
        self.queue = self.store.pending_ids(self.sub_id)
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
            claimed = self.store.claim(self.recipe, tid, self.sub_id, self.ws_limit, self.backend.name)
            if claimed is None:
                row = self.store.trial(self.recipe, tid)
                if self.ws_limit is not None and row is not None and row["status"] == "pending":
                    self.queue.insert(0, tid)  # the workspace is full (other recipes' trials): wait for a slot
                    break
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
        row = self.store.trial(self.recipe, out.trial_id)
        if row is None:
            return
        reason = (info or {}).get("reason") or out.reason
        status = settle(self.store, row, out, reason, self.max_retries, self.timeout_s)
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
        self.store.cancel_pending(self.recipe, submission=self.sub_id)

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
                kind, w = local_attempt(run_dir, attempt)
                if kind == "unstarted":
                    # claimed, but its driver died before starting it (the local backend writes the attempt
                    # header before it spawns): not an attempt, so back to the queue instead of failing as "lost"
                    self.store.set_trial(self.recipe, tid, expect_status="running", status="pending",
                                         owner=None, attempts=max(0, attempt - 1))
                    continue
                if kind == "registering":
                    # started, but its driver died before recording the pid: the worker registers itself in the
                    # run dir (worker.py); until it has, or its grace is over, the attempt is unknown, not lost
                    self.mine[tid] = {"attempt": attempt, "started": row["started_at"] or time.time(),
                                      "reason": None,
                                      "register_by": register_deadline(run_dir, attempt, row["started_at"])}
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
            row = self.store.trial(self.recipe, tid)
            run_dir = Path(row["run_dir"]) if row else None
            kind, w = local_attempt(run_dir, info["attempt"]) if run_dir else ("ended", None)
            if w is not None and w.get("host") == socket.gethostname() and worker.alive(w):
                self.store.set_trial(self.recipe, tid, pid=int(w["pid"]), backend_job_id=str(w["pid"]))
                self._watch_adopted(tid, run_dir, info["attempt"], str(w["pid"]), info["started"])
            elif kind in ("registered", "ended"):
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
            from dpx.registry.plots import write_plots  # matplotlib and duckdb: the driver's last act only

            db = sync.refresh_duckdb(self.ws, force=True)
            figures = write_plots(db, self.ws.runs / self.recipe / "_figures", self.recipe)
        except Exception as e:  # noqa: BLE001 — figures are a nicety; the results are in the run dirs
            print(f"[driver] no recipe figures: {type(e).__name__}: {e}", flush=True)
        counts = self.store.counts(submission=self.sub_id)
        self._mlflow(close_parent, self.tracker, self.parent_id, counts, state, figures)
        # the ones we adopted: closed as their trials ended
        self._mlflow(close_orphan_parents, self.store, self.tracker, self.recipe, self.sub_id, False)
