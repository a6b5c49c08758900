"""One driver per recipe (orchestrator/driver/turns.py) on a real state store: who waits for whom, what is handed over."""
from __future__ import annotations

import os
import socket
import time

from dpx.orchestrator.driver import turns
from dpx.orchestrator.state import StateStore
from dpx.orchestrator.trials import expand


def _sub(store, tmp_path, sub_id, values, pid=None, state="running"):
    p = tmp_path / "t.yaml"
    p.write_text("name: t\ntask: {name: debug}\n")
    ex = expand(p, [f"task.value={','.join(map(str, values))}"])
    store.add_submission(sub_id, "t", str(p), [], "local", ex.trials, lambda t: tmp_path / t.trial_id)
    store.update_submission(sub_id, state=state, driver_pid=pid, driver_host=socket.gethostname())
    return [t.trial_id for t in ex.trials]


def test_later_driver_waits_and_new_trials_are_handed_over(tmp_path):
    store = StateStore(tmp_path / "state.db")
    first = _sub(store, tmp_path, "a", [1.0, 2.0], pid=os.getpid())  # this process: a live driver
    second = _sub(store, tmp_path, "b", [2.0, 3.0], pid=os.getpid(), state="starting")
    assert turns.earlier_live(store, "b")["id"] == "a" and turns.earlier_live(store, "a") is None
    assert turns.live_driver(store, "t", exclude="b")["id"] == "a"
    assert turns.hand_over(store, "b", "a") == 1  # 3.0 is new; 2.0 was in a's queue already
    assert turns.hand_over(store, "b", "a") == 0  # idempotent
    queue = [r["trial_id"] for r in store.trials(submission="a")]
    assert queue == first + [second[1]]
    store.update_submission("a", state="done")
    assert turns.earlier_live(store, "b") is None  # its turn now
    assert turns.wait_turn(store, "b") is True
    assert turns.finish_if_nothing_left(store, "b") is False  # its trials are still pending
    with store.tx() as c:
        c.execute("UPDATE trials SET status = 'completed'")
    assert turns.finish_if_nothing_left(store, "b") is True and store.submission("b")["state"] == "done"


def test_spawning_submission_counts_as_live_and_cancel_while_waiting(tmp_path):
    store = StateStore(tmp_path / "state.db")
    _sub(store, tmp_path, "a", [1.0], pid=None, state="starting")  # its CLI has not recorded the driver pid yet
    _sub(store, tmp_path, "b", [5.0], pid=os.getpid(), state="starting")
    assert turns.earlier_live(store, "b")["id"] == "a"
    store.update_submission("a", created_at=time.time() - turns.SPAWN_GRACE_S - 1)  # its CLI died long ago
    assert turns.earlier_live(store, "b") is None
    store.update_submission("a", created_at=time.time())
    store.update_submission("b", state="cancelling")
    assert turns.wait_turn(store, "b") is False
    turns.cancel_waiting(store, "b")
    assert store.submission("b")["state"] == "cancelled"
    assert [r["status"] for r in store.trials(submission="b")] == ["cancelled"]
