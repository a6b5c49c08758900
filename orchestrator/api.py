"""The Python API (re-exported as `dpx.expand`, `dpx.submit`, `dpx.results`, ...) and the submission logic the CLI
shares with it.

    import dpx
    ex = dpx.expand("recipes/quickstart.yaml", ["model.num_householder=1,2"])   # runs nothing, writes nothing
    sub = dpx.submit("quickstart", ["seeds=[1]"], workspace="/tmp/ws")          # returns at once: a handle
    sub.status()            # {'pending': 2, 'running': 1, 'completed': 0, 'failed': 0, 'cancelled': 0}
    sub.wait()              # blocks until its trials ended and the driver finished MLflow and DuckDB
    df = sub.results()      # pandas DataFrame: one row per trial, config columns and summary metrics
    dpx.results("SELECT recipe, count(*) FROM trials GROUP BY 1", workspace="/tmp/ws")

Bad input raises `dpx.RecipeError` (its `str()` is the CLI's one line: file, key path, reason).
"""
from __future__ import annotations

import importlib.util
import re
import socket
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import refs
from .backends import check_backend
from .driver import turns
from .driver.liveness import driver_alive, driver_process_ended
from .driver.process import spawn_driver
from .errors import RecipeError
from .state import StateStore
from .sync import refresh_duckdb
from .workspace import Workspace

__all__ = ["expand", "submit", "results", "status", "cancel", "Submission", "RecipeError"]


def _workspace(workspace: str | Path | Workspace | None) -> Workspace:
    return workspace if isinstance(workspace, Workspace) else Workspace.resolve(workspace)


def _store(ws: Workspace):
    return StateStore(ws.state_db) if ws.exists else None  # never create a workspace just to read one


def expand(recipe: str | Path, overrides: list[str] | None = None, workspace: str | Path | None = None):
    """The trial grid of a recipe file or name (`Expansion`: .trials with .trial_id/.config/.point, .axes, .meta).
    Runs nothing, writes nothing."""
    from .trials import expand as _expand  # pydantic, omegaconf (~0.4 s): not for status, cancel, results

    ws = _workspace(workspace)
    ref = refs.recipe_file(str(recipe), lambda: _store(ws), need_last=False)
    return _expand(ref.file, list(overrides or []))


# ---- submitting ---------------------------------------------------------------------------------------------------
@dataclass
class Started:
    """What `start` did (the CLI prints it; the API wraps it in a Submission)."""
    sub_id: str
    ws: Workspace
    expansion: Any
    new: int
    counts: dict
    reset: int | None = None  # rerun: failed/cancelled trials queued again
    reused_overrides: tuple[str, list[str]] | None = None  # rerun: (submission id, its overrides) reused
    driver_pid: int | None = None
    handed_to: dict | None = None  # the live driver's submission that took this one's new trials
    handed: int = 0

    @property
    def todo(self) -> int:
        return self.counts["pending"] + self.counts["running"]


def start(recipe: str | Path, overrides: list[str] | None = None, workspace: str | Path | None = None,
          rerun_failed: bool = False) -> Started:
    """Validate, register the trials and start a driver (or hand them to the recipe's live one). Raises RecipeError
    before anything is written."""
    from .trials import expand as _expand  # pydantic, omegaconf (~0.4 s): not for status, cancel, results

    ws = _workspace(workspace)
    ref = refs.recipe_file(str(recipe), lambda: _store(ws), need_last=rerun_failed)
    overrides = list(overrides or [])
    reused = None
    if rerun_failed and not overrides and ref.last_overrides:
        overrides = ref.last_overrides
        reused = (ref.last_submission["id"], overrides)
    ex = _expand(ref.file, overrides)
    _check_extra(ex.meta.hardware.backend, str(ref.file))
    try:
        check_backend(ex.meta.hardware, ws)
    except RecipeError as e:
        raise RecipeError(e.reason, str(ref.file), e.key) from None
    except ImportError as e:  # a backend's stack is an install extra
        backend = ex.meta.hardware.backend
        raise RecipeError(f"backend {backend!r} needs {e.name or e}: pip install 'dpx[{backend}]'", str(ref.file),
                          "hardware.backend") from None
    ws.create()
    store = StateStore(ws.state_db)
    n_reset = store.reset(ex.recipe, ("failed", "cancelled"), [t.trial_id for t in ex.trials]) if rerun_failed else None
    # ids sort in creation order (milliseconds before the random part): `ls .dpx/drivers` lists submissions as made
    now = time.time()
    sub_id = time.strftime("%Y%m%d-%H%M%S-", time.localtime(now)) + f"{int(now * 1000) % 1000:03d}" + uuid.uuid4().hex[:3]
    added = store.add_submission(sub_id, ex.recipe, str(Path(ref.file).absolute()), overrides,
                                 ex.meta.hardware.backend, ex.trials, lambda t: ws.run_dir(ex.recipe, t.trial_id))
    st = Started(sub_id, ws, ex, added["new"], store.counts(submission=sub_id), n_reset, reused)
    if st.todo == 0:
        store.update_submission(sub_id, state="done", ended_at=time.time())
        return st
    live = turns.live_driver(store, ex.recipe, exclude=sub_id)
    if live is not None:
        st.handed_to, st.handed = live, turns.hand_over(store, sub_id, live["id"])
    st.driver_pid = spawn_driver(ws, sub_id)  # waits its turn behind a live one (turns.py)
    store.update_submission(sub_id, driver_pid=st.driver_pid, driver_host=socket.gethostname(), heartbeat=time.time())
    return st


BACKEND_MODULES = {"ray": "ray", "slurm": "submitit"}  # backend -> the module its install extra brings


def _check_extra(backend: str, file: str) -> None:
    mod = BACKEND_MODULES.get(backend)
    if mod and importlib.util.find_spec(mod) is None:
        raise RecipeError(f"backend {backend!r} needs {mod}, which is not installed: pip install 'dpx[{backend}]'",
                          file, "hardware.backend")


def wait_driver(ws: Workspace, store, sub_id: str, limit_s: float | None = 900) -> bool:
    """Wait until the submission's driver process has ended (it finishes MLflow, DuckDB and figures after the
    trials). False when `limit_s` ran out first."""
    t0 = time.time()
    while limit_s is None or time.time() - t0 < limit_s:
        if driver_process_ended(store.submission(sub_id)):  # the process itself, not just its last state write
            return True
        time.sleep(0.2)
    return False


@dataclass
class Submission:
    """A handle on one submission: `status()`, `wait()`, `cancel()`, `results()`."""
    id: str
    recipe: str
    workspace: Workspace
    trial_ids: list[str] = field(default_factory=list)

    def _store(self):
        return StateStore(self.workspace.state_db)

    def status(self) -> dict[str, int]:
        """Trial counts by status (pending, running, completed, failed, cancelled) of this submission."""
        return self._store().counts(submission=self.id)

    @property
    def done(self) -> bool:
        c = self.status()
        return c["pending"] + c["running"] == 0

    def wait(self, timeout: float | None = None, poll_s: float = 0.5) -> dict[str, int]:
        """Block until every trial ended and the driver finished logging; returns the final counts. TimeoutError
        when `timeout` (seconds) runs out first."""
        store, t0 = self._store(), time.time()
        while True:
            c = store.counts(submission=self.id)
            sub = store.submission(self.id)
            if c["pending"] + c["running"] == 0 or (sub["state"] != "starting" and not driver_alive(sub)):
                break
            if timeout is not None and time.time() - t0 > timeout:
                raise TimeoutError(f"submission {self.id}: {c} after {timeout:g} s")
            time.sleep(poll_s)
        left = None if timeout is None else max(1.0, timeout - (time.time() - t0))
        wait_driver(self.workspace, store, self.id, left)
        return store.counts(submission=self.id)

    def cancel(self) -> dict[str, int]:
        """Stop the recipe's running trials and drop its pending ones; returns this submission's counts."""
        cancel(self.recipe, self.workspace)
        return self.status()

    def results(self):
        """pandas DataFrame: this submission's trials from the recipe's `recipe_<name>` view (DuckDB, refreshed)."""
        df = results(self.recipe, self.workspace)
        return df[df["trial_id"].isin(self.trial_ids)].reset_index(drop=True)

    def __repr__(self) -> str:
        return f"Submission({self.id!r}, recipe={self.recipe!r}, {self.status()})"


def submit(recipe: str | Path, overrides: list[str] | None = None, workspace: str | Path | None = None,
           wait: bool = False, timeout: float | None = None) -> Submission:
    """Submit a recipe (file or name) with Hydra-style overrides; returns a Submission at once (or after its
    trials ended with `wait=True`). Completed trials never run again."""
    st = start(recipe, overrides, workspace)
    sub = Submission(st.sub_id, st.expansion.recipe, st.ws, [t.trial_id for t in st.expansion.trials])
    if wait:
        sub.wait(timeout)
    return sub


def cancel(recipe: str, workspace: str | Path | Workspace | None = None, wait_s: float = 60) -> dict:
    """Cancel a recipe (file or name): {"live": bool (a driver did it), "cancelled_pending": n, **counts}."""
    ws = _workspace(workspace)
    store = _store(ws)
    if store is None:
        raise RecipeError(f"{ws.root}: no dpx workspace here yet")
    name = refs.resolve(str(recipe), store).name
    subs = [s for s in store.submissions(name) if s["state"] in ("starting", "running")]
    for s in subs:
        store.update_submission(s["id"], expect_state=("starting", "running"), state="cancelling")  # compare-and-set
    live = [s for s in subs if driver_alive(s) or s["state"] == "starting"]
    n = 0
    if not live:  # no driver to do it: cancel pending trials here
        n = store.cancel_pending(name)
    else:
        deadline = time.time() + wait_s
        while time.time() < deadline and store.counts(recipe=name)["running"]:
            time.sleep(0.5)
    return {"recipe": name, "live": bool(live), "cancelled_pending": n, **store.counts(recipe=name)}


def status(recipe: str | None = None, workspace: str | Path | None = None) -> dict[str, dict[str, int]]:
    """{recipe: trial counts by status} for one recipe (file or name) or all."""
    store = _store(_workspace(workspace))
    if store is None:
        return {}
    names = [refs.resolve(str(recipe), store).name] if recipe else store.recipes()
    return {n: store.counts(recipe=n) for n in names}


# ---- results ------------------------------------------------------------------------------------------------------
_SQL = re.compile(r"^\s*(select|with|from|describe|show|summarize|pivot|values|table)\b", re.I)


def results(recipe_or_sql: str, workspace: str | Path | Workspace | None = None):
    """A pandas DataFrame: a recipe (file or name) gives its `recipe_<name>` view (one row per trial); anything that
    reads as SQL is run as is over the tables and views (`trials`, `metrics`, `curves`, `summary`, `fig5`, ...).
    DuckDB is rebuilt from the run dirs first when they changed."""
    ws = _workspace(workspace)
    store = _store(ws)
    if store is None:
        raise RecipeError(f"{ws.root}: no dpx workspace here yet (submit a recipe first)")
    db = refresh_duckdb(ws)
    from dpx.registry.db import connect  # duckdb, pandas: only results() loads them

    con = connect(db)
    try:
        if _SQL.match(recipe_or_sql):
            sql = recipe_or_sql
        else:
            name = refs.resolve(str(recipe_or_sql), store).name
            row = con.execute("SELECT view_name FROM recipes WHERE recipe = ?", [name]).fetchone()
            if row is None:
                known = [r[0] for r in con.execute("SELECT recipe FROM recipes ORDER BY 1").fetchall()]
                raise RecipeError(f"no trials of recipe {name!r} in {ws.root}; known: {', '.join(known) or 'none'}")
            sql = f'SELECT * FROM "{row[0]}"'
        try:
            return con.execute(sql).df()
        except Exception as e:  # noqa: BLE001 — duckdb's errors for bad SQL are user input errors
            if isinstance(e, RecipeError):
                raise
            raise RecipeError(f"query: {str(e).splitlines()[0]}") from None
    finally:
        con.close()
