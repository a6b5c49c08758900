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
- `adopt_finished(...)` (StateStore.add_submission): a trial new to the store whose run dir already holds its
  completed result.json is registered completed, not pending, so it never runs again.
Trials rebuilt this way have no MLflow run id recorded; `dpx sync` (run by `dpx repair`) finds each one's existing
child run by its `dpx.trial_id` tag instead of making a second one.
"""
from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

WORKER_FILE = "worker.json"


def _run_dirs(ws) -> list[Path]:
    """runs/<recipe>/<trial_id>/ folders that hold a config.json."""
    out = []
    if not ws.runs.is_dir():
        return out
    for rd in sorted(ws.runs.iterdir()):
        if rd.is_dir():
            out += [d for d in sorted(rd.iterdir()) if (d / "config.json").is_file()]
    return out


def _has_run_dirs(ws) -> bool:
    if not ws.runs.is_dir():
        return False
    for rd in ws.runs.iterdir():
        if rd.is_dir():
            for d in rd.iterdir():
                if (d / "config.json").is_file():
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
    try:
        # read-write but reading only: as the last connection it removes the -wal/-shm files on close (a read-only
        # one would leave them behind), and a live driver's WAL is read, not replayed by us
        con = sqlite3.connect(str(p), timeout=60)
        try:
            ok = con.execute("PRAGMA quick_check(1)").fetchone()[0]
            if ok != "ok":
                return f"damaged ({ok[:80]})"
            con.execute("SELECT count(*) FROM trials").fetchone()
        finally:
            con.close()
    except sqlite3.DatabaseError as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "no such table" in msg and not _has_run_dirs(ws):
            return None  # made but not filled yet (a first submit at this moment)
        if "locked" in msg or "busy" in msg:
            return None
        return f"damaged ({msg})"
    return None


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


def file_id(path: Path) -> tuple[int, int] | None:
    """(device, inode) of a file, None when it is gone: a driver notices its state.db deleted or replaced."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _read(path: Path) -> dict | None:
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def _attempts_in_log(d: Path) -> int:
    try:
        with open(d / "log.txt", "rb") as f:
            return f.read().count(b"===== attempt")
    except OSError:
        return 0


def run_dir_state(d: Path, trial_id: str) -> dict:
    """What a run dir says about its trial: status, attempts, error, started/ended, host, pid."""
    res, err, wk = _read(d / "result.json"), _read(d / "error.json"), _read(d / WORKER_FILE)
    attempts = max([_attempts_in_log(d)] + [int(x.get("attempt") or 0) for x in (res, err, wk) if x])
    out = {"status": "pending", "attempts": attempts, "error": None, "started_at": None, "ended_at": None,
           "host": None, "pid": None}
    if res and res.get("status") == "completed" and res.get("trial_id", trial_id) == trial_id:
        out.update(status="completed", started_at=res.get("started_at"), ended_at=res.get("ended_at"),
                   host=res.get("host"))
    elif err and err.get("status") == "failed" and (not wk or int(wk.get("attempt") or 0) <= int(err.get("attempt") or 0)):
        out.update(status="failed", error=str(err.get("error") or "failed").splitlines()[0][:1000],
                   ended_at=err.get("ended_at"))
    elif wk and wk.get("pid"):  # an attempt started and has no outcome yet: the next driver adopts or settles it
        out.update(status="running", pid=int(wk["pid"]), host=wk.get("host"), started_at=wk.get("time"))
    return out


def repair(ws) -> dict:
    """Rebuild (damaged or missing store) or complete (healthy store) the state from the run dirs."""
    from .state import StateStore

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
    now = time.time()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    with store.tx() as c:
        seqs: dict[str, int] = {}
        for d in _run_dirs(ws):
            recipe, tid = d.parent.name, d.name
            cfg = _read(d / "config.json")
            if cfg is None or cfg.get("trial_id", tid) != tid:
                continue
            st = run_dir_state(d, tid)
            sub_id = f"repair-{stamp}-{recipe}"
            cur = c.execute(
                "INSERT OR IGNORE INTO trials (recipe, trial_id, status, attempts, config, point, run_dir, "
                "submission_id, created_at, queued_at, started_at, ended_at, error, host, pid, mlflow_done, "
                "updated_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,0,?)",
                (recipe, tid, st["status"], st["attempts"], json.dumps(cfg), json.dumps({"seed": cfg.get("seed")}),
                 str(d), sub_id, now, now, st["started_at"], st["ended_at"], st["error"], st["host"], st["pid"],
                 now))
            if cur.rowcount:
                stats["added"] += 1
                stats[st["status"]] += 1
                seq = seqs.get(recipe, 0)
                seqs[recipe] = seq + 1
                c.execute("INSERT OR IGNORE INTO submission_trials VALUES (?,?,?,?)", (sub_id, recipe, tid, seq))
                c.execute("INSERT INTO events (time, recipe, trial_id, kind, detail) VALUES (?,?,?,?,?)",
                          (now, recipe, tid, "repaired", st["status"]))
            elif st["status"] == "completed":
                n = c.execute("UPDATE trials SET status = 'completed', attempts = max(attempts, ?), started_at = ?, "
                              "ended_at = ?, error = NULL, mlflow_done = 0, updated_at = ? WHERE recipe = ? AND "
                              "trial_id = ? AND status = 'pending'",
                              (st["attempts"], st["started_at"], st["ended_at"], now, recipe, tid)).rowcount
                stats["fixed"] += n
        for recipe, n in seqs.items():  # one finished submission per recipe holds the rebuilt trials
            c.execute("INSERT INTO submissions (id, recipe, file, overrides, created_at, backend, n_trials, state, "
                      "ended_at) VALUES (?,?,?,?,?,?,?, 'done', ?)",
                      (f"repair-{stamp}-{recipe}", recipe, "", "[]", now, "repair", n, now))
    store.close()
    return stats


def adopt_finished(c: sqlite3.Connection, recipe: str, trial_id: str, run_dir: Path) -> bool:
    """A trial just added as pending whose run dir already holds its completed result (the store was lost or
    replaced): mark it completed so no driver runs it again. One stat for a trial that never ran."""
    if not os.path.exists(os.path.join(str(run_dir), "result.json")):
        return False
    st = run_dir_state(Path(run_dir), trial_id)
    if st["status"] != "completed":
        return False
    c.execute("UPDATE trials SET status = 'completed', attempts = ?, started_at = ?, ended_at = ?, host = ?, "
              "mlflow_done = 0 WHERE recipe = ? AND trial_id = ? AND status = 'pending'",
              (st["attempts"], st["started_at"], st["ended_at"], st["host"], recipe, trial_id))
    return True


def repair_command(ws, console) -> None:
    """`dpx repair`: rebuild or complete the store, then let `dpx sync` find the trials' MLflow runs again."""
    from rich.markup import escape

    stats = repair(ws)
    if stats["moved_aside"]:
        console.print(f"damaged state store kept as {escape(stats['moved_aside'])}", highlight=False)
    console.print(f"state store {escape(str(ws.state_db))}: {stats['added']} trial(s) rebuilt from the run dirs "
                  f"({stats['completed']} completed, {stats['failed']} failed, {stats['running']} running, "
                  f"{stats['pending']} pending), {stats['fixed']} pending trial(s) found completed", highlight=False)
    if ws.mlflow_db.exists() or os.environ.get("DPX_MLFLOW_URI"):
        from .results import sync_mlflow

        n, closed = sync_mlflow(ws)
        console.print(f"MLflow: {n} trial run(s) found again or synced (an existing child run is reused, never "
                      f"duplicated), {closed} parent run(s) closed", highlight=False)
