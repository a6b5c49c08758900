"""Trials whose driver died: what their attempt is doing, and settling the ones that ended when no driver does.

- `local_attempt(row)`: the one reading of a local trial's attempt from its run dir and pid (the driver adopting it,
  loop.py, and `dpx status` settling it, below, both ask it): "unstarted" (claimed, its driver died before it
  started it: back to the queue), "registering" (started, its worker has not written worker.json yet: unknown
  until REGISTER_GRACE_S after its header, not lost), "registered" (worker.json names it: adopt by that pid),
  "ended" (its result.json / error.json is written).
- `refresh_orphans`: `dpx status` and `dpx sync` ask the backend, within a timeout, about running trials whose
  driver is gone, and settle the ended ones from their run dirs exactly as a driver would (retry.settle:
  completed / failed / requeued under max_retries or after preemption). Live ones are left for the next driver
  to adopt; a trial is taken over by a conditional update, so a driver adopting it at the same moment wins or
  loses cleanly.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from ..backends.base import Outcome
from ..backends.slurm import JOB_ID, SlurmBackend, end_reason
from ..hardware import HardwareConfig
from ..state import StateStore
from ..trial import worker
from ..trial.worker import pid_alive
from .attempts import attempt_ended, attempt_started
from .liveness import driver_alive
from .retry import settle

OPEN = ("pending", "running")


def owner_alive(store: StateStore, row) -> bool:
    """The trial's owning submission has a live driver."""
    return bool(row["owner"]) and driver_alive(store.submission(row["owner"]))


def local_attempt(run_dir: Path, attempt: int) -> tuple[str, dict | None]:
    """("unstarted" | "registered" | "registering" | "ended", the worker's registration when "registered")."""
    if not attempt_started(run_dir, attempt):
        return "unstarted", None
    w = worker.registered(run_dir, attempt)
    if w is not None:
        return "registered", w
    return ("ended" if attempt_ended(run_dir, attempt) else "registering"), None


def register_deadline(run_dir: Path, attempt: int, started_at: float | None) -> float:
    """Until when an attempt that has not registered its worker is still starting (after that: lost)."""
    since = worker.header_time(run_dir, attempt) or started_at or time.time()
    return since + worker.REGISTER_GRACE_S


def _local_gone(row) -> bool:
    """The attempt's process provably ended (never a claim that did not start, nor one still registering)."""
    run_dir, attempt = Path(row["run_dir"]), row["attempts"]
    kind, w = local_attempt(run_dir, attempt)
    if kind == "registered":
        return not worker.alive(w)
    if row["pid"]:
        return not pid_alive(row["pid"], row["host"])
    if kind == "registering":
        return time.time() > register_deadline(run_dir, attempt, row["started_at"])
    return kind == "ended"


def refresh_orphans(store: StateStore, recipe: str | None = None, timeout_s: float = 10.0) -> tuple[int, list[str]]:
    """Settle running trials of dead drivers whose attempt ended. Returns (trials settled, notes for the user)."""
    rows = [r for r in store.trials(recipe=recipe, status="running") if not owner_alive(store, r)]
    ended: list[tuple[object, Outcome]] = []
    notes: list[str] = []
    slurm = []
    for r in rows:
        backend = HardwareConfig.of(json.loads(r["config"])).backend
        if backend == "local" and _local_gone(r):
            ended.append((r, Outcome(r["recipe"], r["trial_id"], r["attempts"], None, "lost",
                                     "its driver died and the process is gone")))
        elif backend == "slurm" and r["backend_job_id"]:
            slurm.append(r)
    if slurm:
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
        if not store.take_over(r, me):  # only if no driver adopted it meanwhile
            continue
        hw = HardwareConfig.of(json.loads(r["config"]))
        settle(store, store.trial(r["recipe"], r["trial_id"]), out, out.reason, hw.max_retries, hw.timeout_s)
        n += 1
    return n, notes
