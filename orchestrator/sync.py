"""What the CLI (and a driver at its end) syncs from the run dirs: the DuckDB results database (`refresh_duckdb`,
single writer: rebuilt when the store or a run dir changed) and MLflow (`sync_mlflow`: `dpx sync`, what no driver
logged). Reads the state store and run dirs."""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

from dpx.rundir import CONFIG_JSON, ERROR, METRICS, RESULT

from .driver.adoption import refresh_orphans
from .driver.liveness import driver_alive
from .driver.parents import close_orphan_parents
from .state import StateStore
from .tracking import Tracker
from .tracking_config import TrackingConfig


# ---- DuckDB -------------------------------------------------------------------------------------------------
def trial_records(ws, store: StateStore) -> list[dict]:
    """State rows as plain dicts for the registry (it never imports the orchestrator). Run dirs are located from
    the workspace (runs/<recipe>/<trial_id>), so a workspace copied from another machine reads the same."""
    out = []
    for r in store.trials_by_recipe():
        out.append({
            "trial_id": r["trial_id"], "recipe": r["recipe"], "status": r["status"], "attempts": r["attempts"],
            "run_dir": str(ws.run_dir(r["recipe"], r["trial_id"])), "config": json.loads(r["config"]), "submitted_at": r["created_at"],
            "started_at": r["started_at"], "ended_at": r["ended_at"], "host": r["host"],
            "mlflow_run_id": r["mlflow_run_id"], "error": r["error"]})
    return out


RUN_DIR_FILES = (METRICS, RESULT, ERROR, CONFIG_JSON)


def run_dirs_stamp(ws, rows) -> str:
    """A digest of what ingest reads from the run dirs (size and mtime of each trial's files): `query` rebuilds
    when a run dir changed even though the state store did not (metrics appended after the state said done, a
    trial settled by hand, a result copied in). 4 stats a trial: ~0.1 s at 5,000 trials."""
    h = hashlib.blake2b(digest_size=16)
    for r in rows:
        d = str(ws.run_dir(r["recipe"], r["trial_id"]))
        for name in RUN_DIR_FILES:
            try:
                st = os.stat(f"{d}/{name}")
                h.update(f"{d}/{name}:{st.st_size}:{st.st_mtime_ns};".encode())
            except OSError:
                h.update(b"-;")
    return h.hexdigest()


def refresh_duckdb(ws, force: bool = False) -> Path:
    """Rebuild results.duckdb from the run dirs when the state store or a run dir changed since it was built (or
    when forced)."""
    from dpx.registry import ingest, is_current  # duckdb: the CLI commands that show no results never load it

    store = StateStore(ws.state_db)
    running = store.counts()["running"]
    stamp = ws.root / ".duckdb_stamp"
    key = f"{store.change_mark()}:{run_dirs_stamp(ws, store.trial_keys())}"
    # is_current: also rebuild a database an older dpx built (registry schema_version)
    if not force and running == 0 and is_current(ws.duckdb) and stamp.exists() and stamp.read_text() == key:
        return ws.duckdb
    try:
        ingest(ws.duckdb, trial_records(ws, store))
        stamp.write_text(key)
    except (OSError, duckdb_error()) as e:  # a full disk: answer from the last build, saying so (or one line)
        why = " ".join(str(e).split())[:200]
        if not is_current(ws.duckdb):
            raise OSError(f"cannot build {ws.duckdb}: {why}") from None
        print(f"note: {ws.duckdb} could not be rebuilt ({why}); answering from its last build", file=sys.stderr)
    return ws.duckdb


def duckdb_error():
    import duckdb  # duckdb: only once a build failed (ingest loaded it already)

    return duckdb.Error


# ---- MLflow sync ----------------------------------------------------------------------------------------------
def unforwarded_of_dead_drivers(store: StateStore, recipe: str, me: str) -> list[str]:
    """Trials of `recipe` that ended but whose MLflow run was never finished because the driver forwarding them
    died (SIGKILL mid-forwarding) or because none ran them (a rebuilt store). A new driver forwards them at its
    start (they once waited for a manual `dpx sync`, child runs left RUNNING)."""
    out = []
    alive: dict[str, bool] = {}
    for r in store.unforwarded(recipe):
        owner = r["owner"]
        if owner not in alive:
            sub = store.submission(owner) if owner else None
            alive[owner] = owner == me or (sub is not None and driver_alive(sub))
        if not alive[owner]:
            out.append(r["trial_id"])
    return out


def sync_mlflow(ws) -> tuple[int, int]:
    """Log every finished trial that MLflow does not have complete yet (no driver reached it, or MLflow failed),
    after settling what dead drivers left running; then close their parent runs. Returns (trials synced, parent
    runs closed)."""
    store = StateStore(ws.state_db)
    refresh_orphans(store)
    rows = store.unforwarded()
    if not rows and not store.has_open_parent_runs():
        return 0, 0
    tracker = Tracker(ws.mlflow_uri(), ws.mlflow_artifacts)
    n = 0
    parents: dict[str, tuple[str, str]] = {}
    made: list[str] = []  # parent runs made here, for trials no submission's parent run covers
    for r in rows:
        cfg = json.loads(r["config"])
        exp_name = TrackingConfig.of(cfg).experiment or r["recipe"]
        exp_id = tracker.experiment(exp_name)
        if r["recipe"] not in parents:
            sub = store.submission(r["submission_id"]) if r["submission_id"] else None
            pid = sub["mlflow_parent_run_id"] if sub is not None else None
            if not pid:
                pid = tracker.parent_run(exp_id, f"sync-{time.strftime('%Y%m%d-%H%M%S')}", r["recipe"], "", 0)
                made.append(pid)
            parents[r["recipe"]] = (exp_id, pid)
        row = {**dict(r), "run_dir": str(ws.run_dir(r["recipe"], r["trial_id"]))}
        run_id, off = tracker.sync_trial(exp_id, parents[r["recipe"]][1], row, final=True, find_existing=True)
        store.set_trial(r["recipe"], r["trial_id"], mlflow_run_id=run_id, mlflow_offset=off, mlflow_done=1)
        n += 1
    for pid in made:  # a submission's own parent run is its driver's (or close_orphan_parents') to close
        try:
            tracker.client.set_terminated(pid, "FINISHED")
        except Exception:  # noqa: BLE001
            pass
    return n, close_orphan_parents(store, tracker)
