"""What the CLI shows and syncs after (or while) trials run: results and status tables, DuckDB refresh, MLflow
sync of run dirs. Reads the state store and run dirs; writes DuckDB (single writer: the CLI) and MLflow."""
from __future__ import annotations

import json
import time
from pathlib import Path

from rich.markup import escape  # errors carry log tails ("[dpx] ...", "[/x]"): text, not markup
from rich.table import Table

from dpx.rundir import PREFERRED, read_json

from .driver import driver_alive
from .grid import get_dotted
from .state import StateStore


def _summary(run_dir: str) -> dict:
    res = read_json(Path(run_dir) / "result.json") or {}
    return {k: v for k, v in (res.get("metrics") or {}).items() if isinstance(v, (int, float, str))}


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def print_results(ws, store: StateStore, recipe: str, sub_id: str, axes: list[str], console) -> None:
    rows = store.trials(submission=sub_id)
    sums = {r["trial_id"]: _summary(ws.run_dir(r["recipe"], r["trial_id"])) for r in rows}
    keys: list[str] = []
    for s in sums.values():
        for k, v in s.items():
            if k not in keys and isinstance(v, (int, float)):
                keys.append(k)
    keys.sort(key=lambda k: (PREFERRED.index(k) if k in PREFERRED else len(PREFERRED), k))
    keys = keys[:6]
    t = Table(title=f"{recipe}: results")
    t.add_column("trial_id")
    for a in axes:
        t.add_column(a.split(".")[-1])
    t.add_column("status")
    for k in keys:
        t.add_column(k, justify="right")
    for r in rows:
        cfg = json.loads(r["config"])
        style = {"completed": "green", "failed": "red"}.get(r["status"], "yellow")
        t.add_row(r["trial_id"], *[_fmt(cfg["seed"] if a == "seed" else get_dotted(cfg, a)) for a in axes], f"[{style}]{r['status']}[/{style}]",
                  *[_fmt(sums[r["trial_id"]].get(k, "")) for k in keys])
    console.print(t)
    for r in rows:
        if r["status"] == "failed":
            console.print(f"[red]{r['trial_id']}[/red] failed: {escape(r['error'] or '')}  (dpx logs {r['trial_id']})",
                          highlight=False, soft_wrap=True)


def print_status(ws, store: StateStore, recipe: str | None, console, all_trials: bool = False) -> None:
    from .orphans import refresh_orphans

    settled, backend_notes = refresh_orphans(store, recipe)  # no live driver: ask the backend (local pid, sacct)
    recipes = [recipe] if recipe else sorted({r["recipe"] for r in store.q("SELECT recipe FROM trials")})
    t = Table(title=f"dpx status ({escape(str(ws.root))})")
    for col in ("recipe", "total", "completed", "running", "pending", "failed", "cancelled", "driver"):
        t.add_column(col, justify="right" if col not in ("recipe", "driver") else "left")
    notes = []
    for name in recipes:
        c = store.counts(recipe=name)
        subs = store.submissions(name)
        live = [s for s in subs if driver_alive(s)]
        drv = f"running ({live[-1]['id']})" if live else (subs[-1]["state"] if subs else "-")
        t.add_row(name, str(sum(c.values())), f"[green]{c['completed']}[/green]", f"[cyan]{c['running']}[/cyan]",
                  f"[yellow]{c['pending']}[/yellow]", f"[red]{c['failed']}[/red]", str(c["cancelled"]), drv)
        if not live and (c["pending"] or c["running"]):
            notes.append(f"{name}: no live driver but {c['pending']} pending / {c['running']} running trial(s); "
                         f"`dpx submit` the recipe again to resume (finished trials will not run again)")
    console.print(t)
    for name in recipes:
        for r in store.trials(recipe=name, status="failed"):
            console.print(f"[red]failed[/red] {name}/{r['trial_id']} (attempts {r['attempts']}): {escape(r['error'] or '')}",
                          highlight=False, soft_wrap=True)
        if all_trials:
            for r in store.trials(recipe=name):
                console.print(f"{r['status']:>9} {name}/{r['trial_id']} attempts={r['attempts']} {r['point']}",
                              highlight=False)
    if settled:
        notes.insert(0, f"{settled} trial(s) of a dead driver settled from the backend and their run dirs")
    for n in backend_notes + notes:
        console.print(f"[yellow]note:[/yellow] {escape(n)}", highlight=False)


# ---- DuckDB -------------------------------------------------------------------------------------------------
def trial_records(ws, store: StateStore) -> list[dict]:
    """State rows as plain dicts for the registry (it never imports the orchestrator). Run dirs are located from
    the workspace (runs/<recipe>/<trial_id>), so a workspace copied from another machine reads the same."""
    out = []
    for r in store.q("SELECT * FROM trials ORDER BY recipe, created_at, trial_id"):
        out.append({
            "trial_id": r["trial_id"], "recipe": r["recipe"], "status": r["status"], "attempts": r["attempts"],
            "run_dir": str(ws.run_dir(r["recipe"], r["trial_id"])), "config": json.loads(r["config"]), "submitted_at": r["created_at"],
            "started_at": r["started_at"], "ended_at": r["ended_at"], "host": r["host"],
            "mlflow_run_id": r["mlflow_run_id"], "error": r["error"]})
    return out


RUN_DIR_FILES = ("metrics.jsonl", "result.json", "error.json", "config.json")


def run_dirs_stamp(ws, rows) -> str:
    """A digest of what ingest reads from the run dirs (size and mtime of each trial's files): `query` rebuilds
    when a run dir changed even though the state store did not (metrics appended after the state said done, a
    trial settled by hand, a result copied in). 4 stats a trial: ~0.1 s at 5,000 trials."""
    import hashlib
    import os

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
    from dpx.registry import ingest, is_current

    store = StateStore(ws.state_db)
    last = store.q("SELECT max(updated_at) AS u, count(*) AS n FROM trials")[0]
    running = store.counts()["running"]
    stamp = ws.root / ".duckdb_stamp"
    rows = store.q("SELECT recipe, trial_id FROM trials ORDER BY recipe, trial_id")
    key = f"{last['u']}:{last['n']}:{run_dirs_stamp(ws, rows)}"
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
        import sys

        print(f"note: {ws.duckdb} could not be rebuilt ({why}); answering from its last build", file=sys.stderr)
    return ws.duckdb


def duckdb_error():
    import duckdb

    return duckdb.Error


# ---- MLflow sync ----------------------------------------------------------------------------------------------
def unforwarded_of_dead_drivers(store: StateStore, recipe: str, me: str) -> list[str]:
    """Trials of `recipe` that ended but whose MLflow run was never finished because the driver forwarding them
    died (SIGKILL mid-forwarding) or because none ran them (a rebuilt store). A new driver forwards them at its
    start (they once waited for a manual `dpx sync`, child runs left RUNNING)."""
    out = []
    alive: dict[str, bool] = {}
    for r in store.q("SELECT trial_id, owner FROM trials WHERE recipe = ? AND mlflow_done = 0 AND "
                     "status IN ('completed', 'failed', 'cancelled')", (recipe,)):
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
    from .orphans import close_orphan_parents, refresh_orphans
    from .tracking import Tracker

    store = StateStore(ws.state_db)
    refresh_orphans(store)
    rows = store.q("SELECT * FROM trials WHERE status IN ('completed','failed','cancelled') AND mlflow_done = 0")
    if not rows and not store.q("SELECT 1 FROM submissions WHERE mlflow_parent_run_id IS NOT NULL AND "
                                "state NOT IN ('done', 'cancelled') LIMIT 1"):
        return 0, 0
    tracker = Tracker(ws.mlflow_uri(), ws.mlflow_artifacts)
    n = 0
    parents: dict[str, tuple[str, str]] = {}
    made: list[str] = []  # parent runs made here, for trials no submission's parent run covers
    for r in rows:
        cfg = json.loads(r["config"])
        exp_name = (cfg.get("tracking") or {}).get("experiment") or r["recipe"]
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
