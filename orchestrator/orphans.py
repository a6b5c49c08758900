"""What a dead driver leaves behind, settled when no driver does it: trials still marked running whose attempt has
ended (read from the backend: a dead local pid, Slurm's squeue/sacct), and MLflow parent and child runs left
RUNNING.

- `refresh_orphans`: `dpx status` and `dpx sync` ask the backend, within a timeout, about running trials whose
  driver is gone, and settle the ended ones from their run dirs exactly as a driver would (driver.settle:
  completed / failed / requeued under max_retries or after preemption). Live ones are left for the next driver
  to adopt; a trial is taken over by a conditional update, so a driver adopting it at the same moment wins or
  loses cleanly.
- `close_orphan_parents`: the parent run of a submission whose driver died is closed as its trials' states say
  (FINISHED all completed, FAILED any failed, KILLED cancelled or unfinished), its unfinished trials' child runs
  KILLED; while a live driver of the recipe adopts its trials the parent stays RUNNING and that driver closes it
  when it ends. Run by every driver at its start and end, and by `dpx sync`.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from . import worker
from .backends.base import Outcome
from .driver import _attempt_started, _ended, driver_alive, settle
from .state import StateStore, pid_alive

OPEN = ("pending", "running")


def _owner_alive(store: StateStore, row) -> bool:
    return bool(row["owner"]) and driver_alive(store.submission(row["owner"]))


def _local_gone(row) -> bool:
    """The attempt's process provably ended (never a claim that did not start, nor one still registering)."""
    run_dir, attempt = Path(row["run_dir"]), row["attempts"]
    w = worker.registered(run_dir, attempt)
    if w is not None:
        return not worker.alive(w)
    if row["pid"]:
        return not pid_alive(row["pid"], row["host"])
    if not _attempt_started(run_dir, attempt):
        return False  # claimed, never started: the next driver puts it back in the queue
    since = worker.header_time(run_dir, attempt) or row["started_at"] or time.time()
    return _ended(run_dir, attempt) or time.time() > since + worker.REGISTER_GRACE_S


def refresh_orphans(store: StateStore, recipe: str | None = None, timeout_s: float = 10.0) -> tuple[int, list[str]]:
    """Settle running trials of dead drivers whose attempt ended. Returns (trials settled, notes for the user)."""
    rows = [r for r in store.trials(recipe=recipe, status="running") if not _owner_alive(store, r)]
    ended: list[tuple[object, Outcome]] = []
    notes: list[str] = []
    slurm = []
    for r in rows:
        backend = (json.loads(r["config"]).get("hardware") or {}).get("backend") or "local"
        if backend == "local" and _local_gone(r):
            ended.append((r, Outcome(r["recipe"], r["trial_id"], r["attempts"], None, "lost",
                                     "its driver died and the process is gone")))
        elif backend == "slurm" and r["backend_job_id"]:
            slurm.append(r)
    if slurm:
        from .backends.slurm import JOB_ID, SlurmBackend, end_reason

        jobs = [r["backend_job_id"] for r in slurm if JOB_ID.match(r["backend_job_id"])]
        try:
            states = SlurmBackend.states(jobs, timeout=timeout_s)
        except (subprocess.TimeoutExpired, OSError) as e:
            states = {}
            notes.append(f"slurm: squeue/sacct did not answer ({type(e).__name__}, limit {timeout_s:g} s); "
                         f"{len(slurm)} running trial(s) shown as last recorded")
        for r in slurm:
            st = states.get(r["backend_job_id"])
            reason = end_reason(st[0]) if st else None
            if reason is not None:
                ended.append((r, Outcome(r["recipe"], r["trial_id"], r["attempts"], st[1], reason,
                                         f"Slurm job {r['backend_job_id']} ended {st[0]}")))
    n = 0
    me = f"cli:{os.getpid()}"
    for r, out in ended:
        with store.tx() as c:  # take it over only if no driver adopted it meanwhile
            took = c.execute("UPDATE trials SET owner = ?, updated_at = ? WHERE recipe = ? AND trial_id = ? AND "
                             "status = 'running' AND owner IS ? AND attempts = ?",
                             (me, time.time(), r["recipe"], r["trial_id"], r["owner"], r["attempts"])).rowcount
        if not took:
            continue
        hw = json.loads(r["config"]).get("hardware") or {}
        row = store.q("SELECT * FROM trials WHERE recipe = ? AND trial_id = ?", (r["recipe"], r["trial_id"]))[0]
        settle(store, row, out, out.reason, int(hw.get("max_retries") or 0), (hw.get("timeout_min") or 0) * 60)
        n += 1
    return n, notes


def parent_status(counts: dict[str, int]) -> str:
    if counts["pending"] or counts["running"]:
        return "KILLED"  # its driver died with work left: `dpx submit` resumes it
    if counts["failed"]:
        return "FAILED"
    return "KILLED" if counts["cancelled"] else "FINISHED"


def close_orphan_parents(store: StateStore, tracker, recipe: str | None = None, me: str | None = None,
                         adopting: bool = False) -> int:
    """Close the MLflow parent runs (and unfinished child runs) of submissions whose driver died; returns how many
    parent runs changed. `me`: the calling driver's submission (never a target); `adopting`: it is about to adopt
    their trials, so parents with unfinished trials stay RUNNING for it to close at its end."""
    from mlflow.entities import Metric

    subs = store.submissions(recipe)
    changed = 0
    for rec in sorted({s["recipe"] for s in subs}):
        mine = [s for s in subs if s["recipe"] == rec]
        live = adopting or any(driver_alive(s) for s in mine if s["id"] != me)
        for s in mine:
            if s["id"] == me or s["state"] in ("done", "cancelled", "starting") or driver_alive(s):
                continue
            if s["state"] in ("running", "cancelling"):  # dead without closing: say so (status, waiters)
                store.update_submission(s["id"], state="crashed", ended_at=s["heartbeat"] or time.time())
            parent = s["mlflow_parent_run_id"]
            if not parent:
                continue
            counts = store.counts(submission=s["id"])
            if live and (counts["pending"] or counts["running"]):
                continue  # adopted: the live driver closes it when it ends
            status = parent_status(counts)
            if tracker.client.get_run(parent).info.status != status:
                now = int(time.time() * 1000)
                tracker.client.log_batch(parent, [Metric(f"trials_{k}", v, now, 0) for k, v in counts.items()])
                tracker.client.set_terminated(parent, status)
                changed += 1
            if live:
                continue
            for t in store.trials(submission=s["id"]):
                if t["status"] in OPEN and t["mlflow_run_id"] and not _owner_alive(store, t):
                    if tracker.client.get_run(t["mlflow_run_id"]).info.status == "RUNNING":
                        tracker.client.set_terminated(t["mlflow_run_id"], "KILLED")
    return changed
