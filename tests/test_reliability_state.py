"""The state store under races and damage (issue 16): every status change is a compare-and-set in one
transaction, so a `dpx cancel` that lands before the driver's first write is never overwritten; a deleted,
emptied or truncated state.db is rebuilt from the run dirs (`dpx repair`, or at `submit`) and a completed trial
is never run again."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from test_reliability_faults import attempts_in_log, submissions, trials


def _recipe(tmp_path: Path, n: int, name: str = "race", steps: int = 0) -> Path:
    p = tmp_path / f"{name}.yaml"
    p.write_text(f"name: {name}\ntask: {{name: debug, steps: {steps}}}\ngrid: {{task.value: {list(range(n))}}}\n")
    return p


def test_set_trial_is_compare_and_set(tmp_path):
    from dpx.orchestrator.state import StateStore
    from dpx.orchestrator.trials import expand

    ex = expand(_recipe(tmp_path, 1))
    store = StateStore(tmp_path / "state.db")
    store.add_submission("s1", ex.recipe, "f", [], "local", ex.trials, lambda t: tmp_path / t.trial_id)
    tid = ex.trials[0].trial_id
    assert store.set_trial(ex.recipe, tid, status="cancelled")  # pending -> cancelled
    assert not store.set_trial(ex.recipe, tid, status="completed")  # a late completion never overwrites it
    assert not store.claim(ex.recipe, tid, "other")
    assert store.q("SELECT status FROM trials")[0][0] == "cancelled"
    assert store.set_trial(ex.recipe, tid, status="pending")  # rerun
    assert store.claim(ex.recipe, tid, "me")
    assert store.set_trial(ex.recipe, tid, status="completed")
    assert not store.set_trial(ex.recipe, tid, status="failed")  # completed is final
    assert not store.set_trial(ex.recipe, tid, status="cancelled")
    assert store.q("SELECT status FROM trials")[0][0] == "completed"
    store.update_submission("s1", expect_state=("starting", "running"), state="cancelling")
    assert not store.update_submission("s1", expect_state=("starting",), state="running")
    assert store.submission("s1")["state"] == "cancelling"


def test_cancel_before_the_driver_starts_is_not_overwritten(tmp_path, dpx):
    """`dpx cancel` lands between `submit` registering the submission and its driver's first write (the race of
    a cancel 0.2 s after submit, made deterministic: the driver starts after the cancel). The driver once wrote
    `running` over `cancelling` and ran all 20 trials; now none runs and the submission ends cancelled."""
    from dpx.orchestrator.state import StateStore
    from dpx.orchestrator.trials import expand
    from dpx.orchestrator.workspace import Workspace

    ws = Workspace.resolve(tmp_path / "ws").create()
    recipe = _recipe(tmp_path, 20)
    ex = expand(recipe)
    store = StateStore(ws.state_db)
    store.add_submission("sub-race", ex.recipe, str(recipe), [], "local", ex.trials,
                         lambda t: ws.run_dir(ex.recipe, t.trial_id))  # what `dpx submit` does before the driver
    r = dpx("cancel", "race", ws=ws.root)
    assert r.returncode == 0 and "cancelled" in r.stdout, r.stderr
    assert store.submission("sub-race")["state"] == "cancelling"
    p = subprocess.run([sys.executable, "-m", "dpx.orchestrator.driver", "--workspace", str(ws.root),
                        "--submission", "sub-race"], capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "DPX_FORKSERVER": "0"})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    t = trials(ws.root)
    assert {v["status"] for v in t.values()} == {"cancelled"} and len(t) == 20
    assert all(v["attempts"] == 0 for v in t.values())
    assert sum(attempts_in_log(ws.run_dir("race", tid)) for tid in t) == 0
    assert [s["state"] for s in submissions(ws.root)] == ["cancelled"]
