"""The driver process: `spawn_driver` (the CLI and the API start one per submission, detached) and `main`, what
`python -m dpx.orchestrator.driver --workspace WS --submission ID` runs: wait for the recipe's earlier driver
(turns.py), run the loop (loop.py), record a crash in the state store."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import traceback

from ..state import StateStore
from ..workspace import Workspace
from .loop import Driver
from .turns import cancel_waiting, finish_if_nothing_left, wait_turn


def spawn_driver(ws: Workspace, submission_id: str) -> int:
    """Start a detached driver process (own session: it outlives the CLI and the terminal)."""
    log = open(ws.drivers / f"{submission_id}.log", "ab")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen([sys.executable, "-m", "dpx.orchestrator.driver", "--workspace", str(ws.root),
                          "--submission", submission_id], stdout=log, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL, start_new_session=True, env=env)
    log.close()
    return p.pid


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dpx.orchestrator.driver")
    ap.add_argument("--workspace", required=True)
    ap.add_argument("--submission", required=True)
    a = ap.parse_args(argv)
    ws = Workspace.resolve(a.workspace)
    if not wait_turn(StateStore(ws.state_db), a.submission):
        cancel_waiting(StateStore(ws.state_db), a.submission)
        return 0
    if finish_if_nothing_left(StateStore(ws.state_db), a.submission):  # the earlier driver ran them all
        print(f"[driver] {a.submission}: every trial was run by the recipe's earlier driver; nothing left", flush=True)
        return 0
    d = Driver(ws, a.submission)
    try:
        d.run()
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        print(f"[driver] crashed: {type(e).__name__}: {' '.join(str(e).split())[:300]}", flush=True)
        try:
            d.store.update_submission(a.submission, state="crashed", ended_at=time.time())
        except Exception as e2:  # noqa: BLE001 — a full disk: `dpx status` still sees the driver is dead
            print(f"[driver] could not record the crash either: {e2}", flush=True)
        return 1
    return 0

