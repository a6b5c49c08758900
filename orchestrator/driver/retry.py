"""How an ended attempt ends its trial (the retry policy): completed, failed, or back to pending (preempted, up to
MAX_PREEMPTIONS times; failed, up to the recipe's hardware.max_retries), read from its run dir and how the backend
saw it end. Shared by the driver and by `dpx status` / `dpx sync` when no driver is alive (adoption.py)."""
from __future__ import annotations

import time
from pathlib import Path

from dpx.rundir import ERROR, RESULT, read_json

from ..backends.base import Outcome
from ..state import StateStore
from .attempts import log_tail

MAX_PREEMPTIONS = 50


def settle(store: StateStore, row, out: Outcome, reason: str, max_retries: int, timeout_s: float | None) -> str:
    """Decide how an ended attempt ends its trial, from its run dir (result.json / error.json) and how the backend
    saw it end; write that into the state store and return the new status ("pending": requeued, preempted or
    retried under max_retries). Shared by the driver and by `dpx status` / `dpx sync` when no driver is alive."""
    recipe, tid = row["recipe"], row["trial_id"]
    run_dir = Path(row["run_dir"])
    res, err = read_json(run_dir / RESULT), read_json(run_dir / ERROR)
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
