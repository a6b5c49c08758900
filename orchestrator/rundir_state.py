"""What a trial's run dir says about the trial, read without the state store: the status, attempts, error, times,
host and pid that `dpx repair` rebuilds a lost store from and that `StateStore.add_submission` checks a new trial
against (a run dir already holding its completed result is registered completed, never run again).

Stdlib, dpx.rundir and the trial side's worker.py only: the state store imports it (never the other way).
"""
from __future__ import annotations

import re
from pathlib import Path

from dpx.rundir import ATTEMPT_HEADER, ERROR, LOG, RESULT, WORKER, read_json

from .trial.worker import header_time



def log_attempts(d: Path) -> tuple[int, int]:
    """(attempt headers in log.txt, the highest attempt number they name), from one read of the log: the count is
    every run of the trial, the number the last attempt (a Slurm requeue repeats its attempt's number)."""
    try:
        text = (d / LOG).read_text(errors="replace")
    except OSError:
        return 0, 0
    numbers = [int(n) for n in re.findall(re.escape(ATTEMPT_HEADER) + r"(\d+) ", text)]
    return len(numbers), max(numbers, default=0)


def run_dir_state(d: Path, trial_id: str) -> dict:
    """What a run dir says about its trial: status, attempts, error, started/ended, host, pid."""
    res, err, wk = read_json(d / RESULT), read_json(d / ERROR), read_json(d / WORKER)
    runs, launched = log_attempts(d)
    known = max([0] + [int(x.get("attempt") or 0) for x in (res, err, wk) if x])
    attempts = max(runs, known)
    out = {"status": "pending", "attempts": attempts, "error": None, "started_at": None, "ended_at": None,
           "host": None, "pid": None}
    if res and res.get("status") == "completed" and res.get("trial_id", trial_id) == trial_id:
        out.update(status="completed", started_at=res.get("started_at"), ended_at=res.get("ended_at"),
                   host=res.get("host"))
    elif launched > known:
        # the backend started attempt `launched` (its header is in log.txt) and its worker has not registered yet:
        # running, not pending, or a store rebuilt in that instant would run the trial a second time beside it
        # (issue 16). The next driver treats it as registering: adopted once worker.json appears, lost (and
        # retried) when none appears within the grace after the header.
        out.update(status="running", started_at=header_time(d, launched))
    elif err and err.get("status") == "failed" and (not wk or int(wk.get("attempt") or 0) <= int(err.get("attempt") or 0)):
        out.update(status="failed", error=str(err.get("error") or "failed").splitlines()[0][:1000],
                   ended_at=err.get("ended_at"))
    elif wk and wk.get("pid"):  # an attempt started and has no outcome yet: the next driver adopts or settles it
        out.update(status="running", pid=int(wk["pid"]), host=wk.get("host"), started_at=wk.get("time"))
    return out
