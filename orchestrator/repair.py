"""The state store rebuilt from the run dirs (the source of truth): `dpx repair`, and a check every command runs.

state.db can be lost (deleted, emptied, truncated, overwritten) while the run dirs survive. Then:
- `check(ws)` (every CLI command, before it opens the store) says so in one line: a damaged file (not a database,
  malformed, or empty while run dirs exist) -> "run `dpx repair`"; a missing file while run dirs exist is rebuilt
  on the spot (nothing of value is in the way: the file is gone).
- `repair(ws)` moves a damaged file aside (`state.db.damaged-<time>`, kept, never deleted) and rebuilds the trials
  from `runs/<recipe>/<trial_id>/`: completed when result.json says so for that trial, failed with its error line
  when error.json says so, running (for the next driver or `dpx status` to adopt or settle, as after a driver
  kill) when worker.json names an attempt without an outcome, else pending. On a healthy store it adds the trials
  the store lacks and marks completed the pending ones whose run dir holds their result.
- `StateStore.add_submission` (state.py): a trial new to the store whose run dir already holds its completed
  result.json is registered completed, not pending, so it never runs again. What a run dir says about its trial
  is read in rundir_state.py, for both.
Trials rebuilt this way have no MLflow run id recorded; `dpx sync` (run by `dpx repair`) finds each one's existing
child run by its `dpx.trial_id` tag instead of making a second one.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from rich.markup import escape

from dpx.rundir import CONFIG_JSON, read_json

from .rundir_state import run_dir_state
from .state import StateStore, file_damage
from .sync import sync_mlflow


def _run_dirs(ws) -> list[Path]:
    """runs/<recipe>/<trial_id>/ folders that hold a config.json."""
    out = []
    if not ws.runs.is_dir():
        return out
    for rd in sorted(ws.runs.iterdir()):
        if rd.is_dir():
            out += [d for d in sorted(rd.iterdir()) if (d / CONFIG_JSON).is_file()]
    return out


def _has_run_dirs(ws) -> bool:
    if not ws.runs.is_dir():
        return False
    for rd in ws.runs.iterdir():
        if rd.is_dir():
            for d in rd.iterdir():
                if (d / CONFIG_JSON).is_file():
                    return True
    return False


def damage(ws) -> str | None:
    """What is wrong with the state store file, in a few words, or None when it is usable (or not made yet)."""
    p = ws.state_db
    if not p.exists():
        return "missing" if _has_run_dirs(ws) else None
    if not p.is_file():
        return "not a regular file"
    if p.stat().st_size == 0:
        return "empty" if _has_run_dirs(ws) else None
    what = file_damage(p)
    if what is not None and "no such table" in what and not _has_run_dirs(ws):
        return None  # made but not filled yet (a first submit at this moment)
    return what


def check(ws, heal_missing: bool = True) -> str | None:
    """One line for the user when the store cannot be used, else None. A missing store with run dirs beside it is
    rebuilt at once (returns None after printing nothing: the caller may say so)."""
    what = damage(ws)
    if what is None:
        return None
    if what == "missing" and heal_missing:
        repair(ws)
        return None
    return (f"{ws.state_db}: the state store is {what}; run `dpx repair` to rebuild it from the run dirs in "
            f"{ws.runs} (the damaged file is kept beside it)")


def repair(ws) -> dict:
    """Rebuild (damaged or missing store) or complete (healthy store) the state from the run dirs."""
    stats = {"moved_aside": None, "added": 0, "completed": 0, "failed": 0, "running": 0, "pending": 0, "fixed": 0}
    what = damage(ws)
    if what is not None and what != "missing":
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for suffix in ("", "-wal", "-shm"):
            src = Path(str(ws.state_db) + suffix)
            if src.exists():
                os.replace(src, Path(f"{ws.state_db}.damaged-{stamp}{suffix}"))
        stats["moved_aside"] = f"{ws.state_db}.damaged-{stamp}"
    ws.create()
    store = StateStore(ws.state_db)
    found = []
    for d in _run_dirs(ws):
        cfg = read_json(d / CONFIG_JSON)
        if cfg is None or cfg.get("trial_id", d.name) != d.name:
            continue
        found.append((d.parent.name, d.name, d, cfg, run_dir_state(d, d.name)))
    stats.update(store.restore(found, time.strftime("%Y%m%d-%H%M%S")))
    store.close()
    return stats


def repair_command(ws, console) -> None:
    """`dpx repair`: rebuild or complete the store, then let `dpx sync` find the trials' MLflow runs again."""
    stats = repair(ws)
    if stats["moved_aside"]:
        console.print(f"damaged state store kept as {escape(stats['moved_aside'])}", highlight=False)
    console.print(f"state store {escape(str(ws.state_db))}: {stats['added']} trial(s) rebuilt from the run dirs "
                  f"({stats['completed']} completed, {stats['failed']} failed, {stats['running']} running, "
                  f"{stats['pending']} pending), {stats['fixed']} pending trial(s) found completed", highlight=False)
    if ws.mlflow_db.exists() or os.environ.get("DPX_MLFLOW_URI"):
        n, closed = sync_mlflow(ws)
        console.print(f"MLflow: {n} trial run(s) found again or synced (an existing child run is reused, never "
                      f"duplicated), {closed} parent run(s) closed", highlight=False)
