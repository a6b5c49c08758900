"""The MLflow parent run of a submission: the one rule for its status, and closing it.

- `parent_status(counts, state)`: the status a parent run ends with, from its trials' counts and how its
  submission ended. One table:
      state         trials                                   status
      cancelled     (any)                                    KILLED    `dpx cancel`
      crashed       some pending or running                  KILLED    its driver died with work left (resumable)
      (any)         some failed                              FAILED
      crashed       some cancelled                           KILLED
      (otherwise)                                            FINISHED
  ("done": its driver ended it; "crashed": its driver died and someone else closes the run.)
- `close_parent`: a driver, at its end, logs the trial counts and its figures on its own parent run and ends it.
- `close_orphan_parents`: the parent run of a submission whose driver died is closed as above, its unfinished
  trials' child runs KILLED; while a live driver of the recipe adopts its trials the parent stays RUNNING and that
  driver closes it when it ends. Run by every driver at its start and end, and by `dpx sync`.
"""
from __future__ import annotations

import time

from ..state import StateStore
from .adoption import OPEN, owner_alive
from .liveness import driver_alive


def parent_status(counts: dict[str, int], state: str) -> str:
    crashed = state not in ("done", "cancelled")
    if state == "cancelled" or (crashed and (counts["pending"] or counts["running"])):
        return "KILLED"
    if counts["failed"]:
        return "FAILED"
    return "KILLED" if crashed and counts["cancelled"] else "FINISHED"


def _log_counts(tracker, parent: str, counts: dict[str, int]) -> None:
    from mlflow.entities import Metric  # mlflow: an extra; a caller holding a tracker has it loaded already

    now = int(time.time() * 1000)
    tracker.client.log_batch(parent, [Metric(f"trials_{k}", v, now, 0) for k, v in counts.items()])


def close_parent(tracker, parent: str, counts: dict[str, int], state: str, figures: list) -> None:
    """The driver's own parent run at its end (`state`: done or cancelled): counts, figures, status."""
    try:
        _log_counts(tracker, parent, counts)
    except Exception as e:  # noqa: BLE001 — never fatal: `dpx sync` catches up
        print(f"[driver] MLflow call failed (dpx sync will retry): {e}", flush=True)
    tracker.end_parent(parent, parent_status(counts, state), figures)


def close_orphan_parents(store: StateStore, tracker, recipe: str | None = None, me: str | None = None,
                         adopting: bool = False) -> int:
    """Close the MLflow parent runs (and unfinished child runs) of submissions whose driver died; returns how many
    parent runs changed. `me`: the calling driver's submission (never a target); `adopting`: it is about to adopt
    their trials, so parents with unfinished trials stay RUNNING for it to close at its end."""
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
            status = parent_status(counts, "crashed")
            if tracker.client.get_run(parent).info.status != status:
                _log_counts(tracker, parent, counts)
                tracker.client.set_terminated(parent, status)
                changed += 1
            if live:
                continue
            for t in store.trials(submission=s["id"]):
                if t["status"] in OPEN and t["mlflow_run_id"] and not owner_alive(store, t):
                    if tracker.client.get_run(t["mlflow_run_id"]).info.status == "RUNNING":
                        tracker.client.set_terminated(t["mlflow_run_id"], "KILLED")
    return changed
