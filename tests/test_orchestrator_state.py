"""State store: transitions, atomic claims under concurrent drivers, rerun resets, event log."""
from __future__ import annotations

import multiprocessing as mp
import time
from dataclasses import dataclass, field

from dpx.orchestrator.state import StateStore
from dpx.orchestrator.trial.worker import pid_alive


@dataclass
class T:
    trial_id: str
    config: dict = field(default_factory=lambda: {"x": 1})
    point: dict = field(default_factory=dict)


def _store(tmp_path, n=5):
    s = StateStore(tmp_path / "state.db")
    s.add_submission("s1", "r", "r.yaml", [], "local", [T(f"t{i}") for i in range(n)], lambda t: tmp_path / t.trial_id)
    return s


def test_transitions_and_events(tmp_path):
    s = _store(tmp_path)
    assert s.counts(recipe="r") == {"pending": 5, "running": 0, "completed": 0, "failed": 0, "cancelled": 0}
    row = s.claim("r", "t0", "s1")
    assert row["status"] == "running" and row["attempts"] == 1
    assert s.claim("r", "t0", "s2") is None  # not pending any more
    assert s.set_trial("r", "t0", expect_status="running", status="failed", error="boom")
    assert not s.set_trial("r", "t0", expect_status="running", status="completed")  # guarded transition
    assert s.reset("r", ("failed",)) == 1
    row = s.claim("r", "t0", "s1")
    assert row["attempts"] == 2 and row["error"] is None
    s.set_trial("r", "t0", status="completed")
    assert [e["kind"] for e in s.events("r", "t0")] == ["created", "running", "failed", "running", "completed"]
    # a second submission of the same trials adds nothing and keeps states
    c = s.add_submission("s2", "r", "r.yaml", [], "local", [T(f"t{i}") for i in range(7)], lambda t: tmp_path)
    assert c == {"new": 2, "existing": 5}
    assert s.counts(recipe="r")["completed"] == 1 and len(s.trials(submission="s2")) == 7


def _claimer(path, owner, out):
    s = StateStore(path)
    got = []
    for i in range(40):
        if s.claim("r", f"t{i}", owner) is not None:
            got.append(i)
    out.put((owner, got))


def test_concurrent_claims_never_double_start(tmp_path):
    s = _store(tmp_path, n=40)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_claimer, args=(tmp_path / "state.db", f"d{j}", q)) for j in range(3)]
    for p in procs:
        p.start()
    results = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
    claimed = [i for _, got in results for i in got]
    assert sorted(claimed) == list(range(40))  # every trial claimed exactly once
    assert all(r["attempts"] == 1 for r in s.trials(recipe="r"))


def test_pid_alive(tmp_path):
    import os
    import subprocess
    import sys

    assert pid_alive(os.getpid())
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert not pid_alive(p.pid)
    assert not pid_alive(None)
