"""`dpx status` with no live driver refreshes Slurm trials from the scheduler (squeue/sacct, within a timeout) and
settles the ended ones from their run dirs, instead of showing the states the dead driver last wrote. On the
real one-node cluster of .ci/slurm_up.sh (the fixture of test_backend_slurm.py)."""
from __future__ import annotations

import os
import signal
import time

import pytest

from conftest import run_dpx, write_recipe
from test_backend_slurm import FAST, rows_of, slurm, wait_for  # noqa: F401  (slurm: the module's cluster)

pytestmark = pytest.mark.slow


def test_status_refreshes_from_slurm_when_the_driver_is_gone(tmp_path, slurm):  # noqa: F811
    from dpx.orchestrator.backends.slurm import ALIVE, SlurmBackend
    from dpx.orchestrator.state import StateStore

    ws = tmp_path / "ws"
    recipe = write_recipe(tmp_path / "ss.yaml", """
name: ss
task: {name: debug, steps: 2, sleep_s: 2}
grid: {zip: {task.value: [1, 2, 3], task.fail: [false, true, false], task.sleep_s: [2, 2, 600]}}
hardware: {backend: slurm, slurm: {time_min: 15, array_parallelism: 3, mem_gb: 0.25}}
tracking: {enabled: false}
""")
    ok, bad, slow = run_dpx("expand", str(recipe), "--format", "ids").stdout.split()
    r = run_dpx("submit", str(recipe), ws=ws, env=FAST)
    assert r.returncode == 0 and "sbatch accepted" in r.stdout, r.stdout + r.stderr
    (sub,) = [dict(s) for s in StateStore(ws / "state.db").submissions("ss")]
    os.kill(sub["driver_pid"], signal.SIGKILL)  # no driver from here on: only `dpx status` can notice
    jobs = {t: row["backend_job_id"] for t, row in rows_of(ws, "ss").items()}

    def ended():
        st = SlurmBackend.states([jobs[ok], jobs[bad]])
        return all(j in st and st[j][0] not in ALIVE for j in (jobs[ok], jobs[bad]))

    wait_for(ended, 240, "the two short array tasks to end in Slurm")
    wait_for(lambda: SlurmBackend.states([jobs[slow]]).get(jobs[slow], ("",))[0] == "RUNNING", 120, "slow running")
    before = rows_of(ws, "ss")
    assert all(before[t]["status"] == "running" for t in (ok, bad, slow))  # what the dead driver left

    from dpx.orchestrator.driver.adoption import refresh_orphans

    n, notes = refresh_orphans(StateStore(ws / "state.db"), "ss", timeout_s=1e-3)  # squeue cannot answer in 1 ms
    assert n == 0 and len(notes) == 1 and "did not answer" in notes[0], notes
    assert rows_of(ws, "ss") == before  # nothing settled on a guess

    t0 = time.time()
    st = run_dpx("status", str(recipe), ws=ws)
    took = time.time() - t0
    assert st.returncode == 0, st.stdout + st.stderr
    after = rows_of(ws, "ss")
    assert after[ok]["status"] == "completed" and after[ok]["attempts"] == 1, after[ok]
    assert after[bad]["status"] == "failed" and "RuntimeError" in after[bad]["error"], after[bad]
    assert after[slow]["status"] == "running"  # still running in Slurm: left for the next driver to adopt
    assert "no live driver" in st.stdout and "settled from the backend" in st.stdout, st.stdout
    assert f"failed ss/{bad}" in st.stdout, st.stdout
    assert took < 60, took  # a status call, not a wait

    # scancel'ed outside dpx (an admin, a time limit): the next status sees it ended and says how
    import subprocess

    subprocess.run(["scancel", jobs[slow]], check=True)
    wait_for(lambda: SlurmBackend.states([jobs[slow]]).get(jobs[slow], ("RUNNING",))[0] not in ALIVE, 120,
             "the slow job cancelled")
    st = run_dpx("status", str(recipe), ws=ws)
    assert st.returncode == 0, st.stdout + st.stderr
    assert rows_of(ws, "ss")[slow]["status"] == "cancelled"
