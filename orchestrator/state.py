"""State store: one SQLite file (WAL) in the workspace, written only by the CLI and drivers, never by trials.

Trial states:  pending → running → completed | failed | cancelled;  failed/cancelled → pending (`rerun`);
               running → pending (preempted, or retried under the recipe's max_retries).
A trial is claimed with a conditional UPDATE (`... WHERE status = 'pending'`), so two drivers — two concurrent
`dpx submit` of one recipe — can never start the same trial. Every write is one short IMMEDIATE transaction with
a long busy timeout, so concurrent CLIs wait instead of failing with "database is locked".

All SQL on state.db is in this module: the rest of dpx asks a StateStore method.
"""
from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from dpx.rundir import RESULT

from .rundir_state import run_dir_state

STATUSES = ("pending", "running", "completed", "failed", "cancelled")
# new status -> the states it may come from (set_trial's compare-and-set when no expect_status is given)
TRANSITIONS = {
    "running": ("pending",),
    "completed": ("running",),
    "failed": ("running", "pending"),
    "cancelled": ("running", "pending"),
    "pending": ("running", "failed", "cancelled"),
}
SCHEMA_VERSION = 1

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS submissions (
  id TEXT PRIMARY KEY, recipe TEXT NOT NULL, file TEXT, overrides TEXT, created_at REAL, backend TEXT,
  n_trials INTEGER, state TEXT DEFAULT 'running', driver_pid INTEGER, driver_host TEXT, heartbeat REAL,
  mlflow_experiment_id TEXT, mlflow_parent_run_id TEXT, ended_at REAL
);
CREATE TABLE IF NOT EXISTS trials (
  recipe TEXT NOT NULL, trial_id TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'pending',
  attempts INTEGER NOT NULL DEFAULT 0, config TEXT NOT NULL, point TEXT, run_dir TEXT NOT NULL,
  submission_id TEXT, owner TEXT, created_at REAL, queued_at REAL, started_at REAL, ended_at REAL,
  error TEXT, host TEXT, pid INTEGER, backend_job_id TEXT, mlflow_run_id TEXT, mlflow_offset INTEGER DEFAULT 0,
  mlflow_done INTEGER DEFAULT 0, preemptions INTEGER DEFAULT 0, updated_at REAL,
  PRIMARY KEY (recipe, trial_id)
);
CREATE INDEX IF NOT EXISTS trials_status ON trials (recipe, status);
CREATE TABLE IF NOT EXISTS submission_trials (
  submission_id TEXT NOT NULL, recipe TEXT NOT NULL, trial_id TEXT NOT NULL, seq INTEGER,
  PRIMARY KEY (submission_id, recipe, trial_id)
);
CREATE TABLE IF NOT EXISTS events (
  id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL, recipe TEXT, trial_id TEXT, kind TEXT, detail TEXT
);
"""


class StateStore:
    BUSY_TRIES = 200  # retries past SQLite's busy timeout before a locked store is an error (tests shrink it)

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite3.connect(str(self.path), timeout=120, isolation_level=None, check_same_thread=False)
        self.conn.row_factory = sqlite3.Row
        self.conn.execute("PRAGMA busy_timeout = 120000")
        # switching a fresh file to WAL takes an exclusive lock that a second CLI opening the same new workspace can
        # hold: SQLite may answer "database is locked" at once there rather than wait (CI, session 27: one of two
        # concurrent `dpx submit` exited with it), so it waits as a transaction's BEGIN does
        self._until_not_busy("PRAGMA journal_mode = WAL")
        self.conn.execute("PRAGMA synchronous = NORMAL")
        with self.tx() as c:
            for stmt in SCHEMA.split(";"):
                if stmt.strip():
                    c.execute(stmt)
            c.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))

    def close(self) -> None:
        self.conn.close()

    def _retry_busy(self, fn, what: str, backoff: bool = True):
        """fn(), retried while SQLite says locked or busy beyond the busy timeout (never surfaced), BUSY_TRIES times
        (~55 s of sleeps with backoff, 10 s without), then an error: going on would, for a BEGIN, run tx's body
        outside a transaction."""
        for attempt in range(self.BUSY_TRIES):
            try:
                return fn()
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) and "busy" not in str(e):
                    raise
                time.sleep(0.05 * (1 + attempt % 10) if backoff else 0.05)
        raise RuntimeError(f"state store {self.path} stayed locked{what}")

    def _until_not_busy(self, sql: str) -> None:
        self._retry_busy(lambda: self.conn.execute(sql), f": {sql!r} did not get through")

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One IMMEDIATE transaction (takes the write lock up front, so it never deadlocks on upgrade)."""
        self._until_not_busy("BEGIN IMMEDIATE")
        try:
            yield self.conn
            self.conn.execute("COMMIT")
        except BaseException:
            try:  # a failed COMMIT (disk full) may have ended the transaction already: the ROLLBACK's own error
                self.conn.execute("ROLLBACK")  # ("cannot rollback - no transaction is active") must not hide it
            except sqlite3.Error:
                pass
            raise

    def q(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        return self._retry_busy(lambda: self.conn.execute(sql, args).fetchall(), "", backoff=False)

    # ---- submissions --------------------------------------------------------------------------------------
    def add_submission(self, sub_id: str, recipe: str, file: str, overrides: list[str], backend: str,
                       trials: list[Any], run_dir_of) -> dict[str, int]:
        """Register a submission and its trials. New trials start pending; existing ones keep their state."""
        now = time.time()
        counts = {"new": 0, "existing": 0}
        with self.tx() as c:
            c.execute("INSERT INTO submissions (id, recipe, file, overrides, created_at, backend, n_trials, state)"
                      " VALUES (?,?,?,?,?,?,?, 'starting')",
                      (sub_id, recipe, file, json.dumps(overrides), now, backend, len(trials)))
            for seq, t in enumerate(trials):
                cur = c.execute(
                    "INSERT OR IGNORE INTO trials (recipe, trial_id, status, config, point, run_dir, submission_id,"
                    " created_at, queued_at, updated_at) VALUES (?,?, 'pending', ?,?,?,?,?,?,?)",
                    (recipe, t.trial_id, json.dumps(t.config), json.dumps(t.point), str(run_dir_of(t)), sub_id,
                     now, now, now))
                counts["new" if cur.rowcount else "existing"] += 1
                if cur.rowcount:
                    _adopt_finished(c, recipe, t.trial_id, run_dir_of(t))  # its run dir says completed: never rerun
                    c.execute("INSERT INTO events (time, recipe, trial_id, kind, detail) VALUES (?,?,?,?,?)",
                              (now, recipe, t.trial_id, "created", sub_id))
                c.execute("INSERT OR IGNORE INTO submission_trials VALUES (?,?,?,?)", (sub_id, recipe, t.trial_id, seq))
        return counts

    def submission(self, sub_id: str) -> sqlite3.Row | None:
        rows = self.q("SELECT * FROM submissions WHERE id = ?", (sub_id,))
        return rows[0] if rows else None

    def update_submission(self, sub_id: str, expect_state: tuple[str, ...] | None = None, **fields: Any) -> bool:
        """Update a submission; with `expect_state`, only while its state is one of those (compare-and-set in one
        transaction: a driver starting up cannot overwrite `cancelling` with `running`). True when written."""
        sets = ", ".join(f"{k} = ?" for k in fields)
        sql, args = f"UPDATE submissions SET {sets} WHERE id = ?", [*fields.values(), sub_id]
        if expect_state:
            sql += f" AND state IN ({','.join('?' for _ in expect_state)})"
            args += list(expect_state)
        with self.tx() as c:
            return c.execute(sql, tuple(args)).rowcount > 0

    def submissions(self, recipe: str | None = None) -> list[sqlite3.Row]:
        if recipe:
            return self.q("SELECT * FROM submissions WHERE recipe = ? ORDER BY created_at", (recipe,))
        return self.q("SELECT * FROM submissions ORDER BY created_at")

    # ---- trials -------------------------------------------------------------------------------------------
    def trials(self, recipe: str | None = None, status: str | None = None,
               submission: str | None = None) -> list[sqlite3.Row]:
        sql, args = "SELECT t.* FROM trials t", []
        where = []
        if submission:
            sql += " JOIN submission_trials s ON s.recipe = t.recipe AND s.trial_id = t.trial_id"
            where.append("s.submission_id = ?")
            args.append(submission)
        if recipe:
            where.append("t.recipe = ?")
            args.append(recipe)
        if status:
            where.append("t.status = ?")
            args.append(status)
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY s.seq" if submission else " ORDER BY t.created_at, t.trial_id"
        return self.q(sql, tuple(args))

    def trial(self, recipe: str, trial_id: str) -> sqlite3.Row | None:
        rows = self.q("SELECT * FROM trials WHERE recipe = ? AND trial_id = ?", (recipe, trial_id))
        return rows[0] if rows else None

    def recipes(self) -> list[str]:
        """The recipes that have trials, sorted."""
        return sorted(r[0] for r in self.q("SELECT DISTINCT recipe FROM trials"))

    def trials_by_recipe(self) -> list[sqlite3.Row]:
        """Every trial, by recipe then creation (what the registry ingests)."""
        return self.q("SELECT * FROM trials ORDER BY recipe, created_at, trial_id")

    def trial_keys(self) -> list[sqlite3.Row]:
        """(recipe, trial_id) of every trial, sorted."""
        return self.q("SELECT recipe, trial_id FROM trials ORDER BY recipe, trial_id")

    def change_mark(self) -> str:
        """Changes whenever a trial is added or updated: `max(updated_at):count`."""
        last = self.q("SELECT max(updated_at) AS u, count(*) AS n FROM trials")[0]
        return f"{last['u']}:{last['n']}"

    def pending_ids(self, submission: str) -> list[str]:
        """The submission's pending trials, in its grid order (ids only: the driver's light queue query)."""
        return [r[0] for r in self.q(
            "SELECT t.trial_id FROM trials t JOIN submission_trials s ON s.recipe = t.recipe AND "
            "s.trial_id = t.trial_id WHERE s.submission_id = ? AND t.status = 'pending' ORDER BY s.seq",
            (submission,))]

    def unforwarded(self, recipe: str | None = None) -> list[sqlite3.Row]:
        """Ended trials whose MLflow run is not complete (mlflow_done = 0), of one recipe or all."""
        sql = "SELECT * FROM trials WHERE status IN ('completed', 'failed', 'cancelled') AND mlflow_done = 0"
        return self.q(sql + " AND recipe = ?", (recipe,)) if recipe else self.q(sql)

    def has_open_parent_runs(self) -> bool:
        """A submission with an MLflow parent run that is not done or cancelled (a parent `dpx sync` may close)."""
        return bool(self.q("SELECT 1 FROM submissions WHERE mlflow_parent_run_id IS NOT NULL AND "
                           "state NOT IN ('done', 'cancelled') LIMIT 1"))

    def cancel_pending(self, recipe: str, submission: str | None = None) -> int:
        """Cancel the recipe's pending trials (only those of `submission` when given); returns how many. The one
        pending-trial cancel: `dpx cancel` with no live driver, the driver's cancel, a waiting driver's cancel."""
        sql = "UPDATE trials SET status = 'cancelled', error = 'cancelled by user', updated_at = ? " \
              "WHERE recipe = ? AND status = 'pending'"
        args: tuple = (time.time(), recipe)
        if submission is not None:
            sql += " AND trial_id IN (SELECT trial_id FROM submission_trials WHERE submission_id = ?)"
            args += (submission,)
        with self.tx() as c:
            return c.execute(sql, args).rowcount

    def take_over(self, row: sqlite3.Row, owner: str) -> bool:
        """Make `owner` the owner of a running trial, only if nobody (no driver) took it since `row` was read."""
        with self.tx() as c:
            return c.execute("UPDATE trials SET owner = ?, updated_at = ? WHERE recipe = ? AND trial_id = ? AND "
                             "status = 'running' AND owner IS ? AND attempts = ?",
                             (owner, time.time(), row["recipe"], row["trial_id"], row["owner"],
                              row["attempts"])).rowcount > 0

    # ---- one driver per recipe (turns.py) -------------------------------------------------------------------
    def hand_over(self, from_sub: str, to_sub: str) -> int:
        """Put `from_sub`'s pending trials into `to_sub`'s queue (after its own); returns how many were added."""
        with self.tx() as c:
            recipe = c.execute("SELECT recipe FROM submissions WHERE id = ?", (from_sub,)).fetchone()[0]
            top = c.execute("SELECT coalesce(max(seq), -1) FROM submission_trials WHERE submission_id = ?",
                            (to_sub,)).fetchone()[0]
            rows = c.execute(
                "SELECT s.trial_id FROM submission_trials s JOIN trials t ON t.recipe = s.recipe AND t.trial_id = "
                "s.trial_id WHERE s.submission_id = ? AND t.status = 'pending' AND s.trial_id NOT IN "
                "(SELECT trial_id FROM submission_trials WHERE submission_id = ?) ORDER BY s.seq",
                (from_sub, to_sub)).fetchall()
            for i, (tid,) in enumerate(rows):
                c.execute("INSERT OR IGNORE INTO submission_trials VALUES (?,?,?,?)", (to_sub, recipe, tid, top + 1 + i))
            return len(rows)

    def finish_if_nothing_left(self, sub_id: str) -> bool:
        """A `starting` submission none of whose trials is pending or running ends `done`; True when it did."""
        with self.tx() as c:
            left = c.execute("SELECT count(*) FROM submission_trials s JOIN trials t ON t.recipe = s.recipe AND "
                             "t.trial_id = s.trial_id WHERE s.submission_id = ? AND t.status IN ('pending', 'running')",
                             (sub_id,)).fetchone()[0]
            if left:
                return False
            return c.execute("UPDATE submissions SET state = 'done', ended_at = ? WHERE id = ? AND state = 'starting'",
                             (time.time(), sub_id)).rowcount > 0

    # ---- `dpx repair` -------------------------------------------------------------------------------------
    def restore(self, found: list[tuple[str, str, Path, dict, dict]], stamp: str) -> dict[str, int]:
        """Add the trials of run dirs the store lacks, `found` = [(recipe, trial_id, run_dir, config, state)] with
        state from rundir_state.run_dir_state, one finished `repair-<stamp>-<recipe>` submission per recipe holding
        them; mark completed the pending ones whose run dir holds their result. Returns counts by outcome."""
        stats = {"added": 0, "completed": 0, "failed": 0, "running": 0, "pending": 0, "fixed": 0}
        now = time.time()
        with self.tx() as c:
            seqs: dict[str, int] = {}
            for recipe, tid, d, cfg, st in found:
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
                    self._event(c, recipe, tid, "repaired", st["status"], now)
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
        return stats

    def find_trial(self, prefix: str) -> list[sqlite3.Row]:
        return self.q("SELECT * FROM trials WHERE trial_id LIKE ? ORDER BY recipe", (prefix + "%",))

    def counts(self, recipe: str | None = None, submission: str | None = None) -> dict[str, int]:
        out = {s: 0 for s in STATUSES}
        for r in self.trials(recipe=recipe, submission=submission):
            out[r["status"]] += 1
        return out

    def claim(self, recipe: str, trial_id: str, owner: str, limit: int | None = None,
              backend: str | None = None) -> sqlite3.Row | None:
        """pending → running for this owner, atomically; None when someone else got it (or it is not pending), or,
        with `limit`, when the workspace already runs `limit` trials on `backend` (every recipe's: the trials owned
        by submissions of that backend). One statement, so two drivers can never both take the last slot."""
        now = time.time()
        sql = ("UPDATE trials SET status = 'running', owner = ?, attempts = attempts + 1, started_at = ?,"
               " ended_at = NULL, error = NULL, host = ?, pid = NULL, updated_at = ?"
               " WHERE recipe = ? AND trial_id = ? AND status = 'pending'")
        args: list[Any] = [owner, now, socket.gethostname(), now, recipe, trial_id]
        if limit is not None:
            sql += (" AND (SELECT count(*) FROM trials t JOIN submissions s ON s.id = t.owner"
                    " WHERE t.status = 'running' AND s.backend = ?) < ?")
            args += [backend, int(limit)]
        with self.tx() as c:
            cur = c.execute(sql, tuple(args))
            if not cur.rowcount:
                return None
            self._event(c, recipe, trial_id, "running", owner)
            return c.execute("SELECT * FROM trials WHERE recipe = ? AND trial_id = ?", (recipe, trial_id)).fetchone()

    def set_trial(self, recipe: str, trial_id: str, expect_status: str | None = None, **fields: Any) -> bool:
        """Update fields of a trial; logs status changes. A status change is always a compare-and-set in one
        transaction: only from `expect_status` when given, else only from a state that may lead to the new one
        (TRANSITIONS), so a late writer can never overwrite a cancel or a completion. False when not written."""
        fields["updated_at"] = time.time()
        sets = ", ".join(f"{k} = ?" for k in fields)
        sql = f"UPDATE trials SET {sets} WHERE recipe = ? AND trial_id = ?"
        args = [*fields.values(), recipe, trial_id]
        if expect_status:
            sql += " AND status = ?"
            args.append(expect_status)
        elif "status" in fields:
            prev = TRANSITIONS[fields["status"]]
            sql += f" AND status IN ({','.join('?' for _ in prev)})"
            args += list(prev)
        with self.tx() as c:
            ok = c.execute(sql, tuple(args)).rowcount > 0
            if ok and "status" in fields:
                self._event(c, recipe, trial_id, fields["status"], fields.get("error") or "")
        return ok

    def reset(self, recipe: str, statuses: tuple[str, ...], trial_ids: list[str] | None = None) -> int:
        """Put failed/cancelled trials back to pending (rerun). Attempts are kept (they count)."""
        marks = ",".join("?" for _ in statuses)
        sql = f"UPDATE trials SET status = 'pending', owner = NULL, updated_at = ? WHERE recipe = ? AND status IN ({marks})"
        args: list[Any] = [time.time(), recipe, *statuses]
        if trial_ids is not None:
            sql += f" AND trial_id IN ({','.join('?' for _ in trial_ids)})"
            args += trial_ids
        with self.tx() as c:
            return c.execute(sql, tuple(args)).rowcount

    def events(self, recipe: str, trial_id: str) -> list[sqlite3.Row]:
        return self.q("SELECT * FROM events WHERE recipe = ? AND trial_id = ? ORDER BY id", (recipe, trial_id))

    @staticmethod
    def _event(c: sqlite3.Connection, recipe: str, trial_id: str, kind: str, detail: str,
               at: float | None = None) -> None:
        c.execute("INSERT INTO events (time, recipe, trial_id, kind, detail) VALUES (?,?,?,?,?)",
                  (time.time() if at is None else at, recipe, trial_id, kind, detail))


def _adopt_finished(c: sqlite3.Connection, recipe: str, trial_id: str, run_dir: Path) -> bool:
    """A trial just added as pending whose run dir already holds its completed result (the store was lost or
    replaced): mark it completed so no driver runs it again. One stat for a trial that never ran."""
    if not os.path.exists(os.path.join(str(run_dir), RESULT)):
        return False
    st = run_dir_state(Path(run_dir), trial_id)
    if st["status"] != "completed":
        return False
    c.execute("UPDATE trials SET status = 'completed', attempts = ?, started_at = ?, ended_at = ?, host = ?, "
              "mlflow_done = 0 WHERE recipe = ? AND trial_id = ? AND status = 'pending'",
              (st["attempts"], st["started_at"], st["ended_at"], st["host"], recipe, trial_id))
    return True


def file_id(path: Path) -> tuple[int, int] | None:
    """(device, inode) of a file, None when it is gone: a driver notices its state.db deleted or replaced."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def file_damage(path: Path) -> str | None:
    """What SQLite says is wrong with the file at `path` (a store file that exists), in a few words, or None when
    it reads (locked or busy: a writer holds it, which is not damage)."""
    try:
        # read-write but reading only: as the last connection it removes the -wal/-shm files on close (a read-only
        # one would leave them behind), and a live driver's WAL is read, not replayed by us
        con = sqlite3.connect(str(path), timeout=60)
        try:
            ok = con.execute("PRAGMA quick_check(1)").fetchone()[0]
            if ok != "ok":
                return f"damaged ({ok[:80]})"
            con.execute("SELECT count(*) FROM trials").fetchone()
        finally:
            con.close()
    except sqlite3.DatabaseError as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "locked" in msg or "busy" in msg:
            return None
        return f"damaged ({msg})"
    return None

