"""A driver killed after starting a trial but before recording its pid (local backend): the next driver must
adopt the still-running worker (it registers itself in its run dir), not settle it as "worker lost" and run it a
second time. Real runner processes in their own sessions, the real CLI, the real state store."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from test_reliability_faults import attempts_in_log, trials


def test_started_but_unrecorded_trials_are_adopted_not_lost(tmp_path, dpx):
    from dpx.orchestrator.driver import write_run_dir
    from dpx.orchestrator.state import StateStore
    from dpx.orchestrator.trials import expand
    from dpx.orchestrator.workspace import Workspace

    recipe = tmp_path / "adopt.yaml"
    recipe.write_text("name: adopt\ntask: {name: debug, steps: 4, sleep_s: 4.0}\ntracking: {enabled: false}\n"
                      "grid: {task.value: [1.0, 2.0, 3.0]}\nhardware: {max_parallel: 2, max_retries: 1}\n")
    ex = expand(recipe)
    w = Workspace(tmp_path / "ws").create()
    store = StateStore(w.state_db)
    store.add_submission("dead", ex.recipe, str(recipe), [], "local", ex.trials,
                         lambda t: w.run_dir("adopt", t.trial_id))
    gone = subprocess.Popen(["true"])
    gone.wait()  # the dead driver's pid
    store.update_submission("dead", state="running", driver_pid=gone.pid, driver_host=socket.gethostname())
    running, late, untouched = (t.trial_id for t in ex.trials)
    procs = {}
    for tid, delay in ((running, 0), (late, 3)):  # `late`: its Python still starting when the next driver looks
        row = store.claim("adopt", tid, "dead")
        d = Path(row["run_dir"])
        write_run_dir(d, json.loads(row["config"]))
        with open(d / "log.txt", "ab") as log:  # what the local backend does, up to the spawn...
            log.write(f"\n===== attempt 1 {time.strftime('%Y-%m-%d %H:%M:%S')} =====\n".encode())
            cmd = [sys.executable, "-m", "dpx.orchestrator.runner", str(d), "--attempt", "1"]
            if delay:
                cmd = ["sh", "-c", f'sleep {delay}; exec "$@"', "sh", *cmd]
            procs[tid] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=d, start_new_session=True,
                                          env={**os.environ, "DPX_FORKSERVER": "0"})
        # ... and the driver is SIGKILLed before `set_trial(pid=...)`: the state store has no pid for either
    store.close()
    assert all(r["pid"] is None and r["status"] == "running" for t, r in trials(w.root).items() if t != untouched)

    r = dpx("submit", str(recipe), "--wait", ws=w.root)
    for p in procs.values():
        p.wait(timeout=60)
    t = trials(w.root)
    assert r.returncode == 0, r.stdout + r.stderr
    for tid in (running, late, untouched):
        assert t[tid]["status"] == "completed" and t[tid]["attempts"] == 1, t[tid]
        assert attempts_in_log(w.run_dir("adopt", tid)) == 1  # ran once: no second attempt beside the first
    for tid, p in procs.items():  # completed by the very process started before the driver died
        res = json.loads((w.run_dir("adopt", tid) / "result.json").read_text())
        assert res["pid"] == p.pid and res["attempt"] == 1
        assert t[tid]["pid"] == p.pid  # the adopting driver recorded the registered pid
