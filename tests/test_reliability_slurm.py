"""Slurm reliability on real clusters of .ci/slurm_up.sh (the fixtures of test_backend_slurm.py).

- `dpx status` with no live driver refreshes Slurm trials from the scheduler (squeue/sacct, within a timeout) and
  settles the ended ones from their run dirs, instead of showing the states the dead driver last wrote (one node).
- Beyond one node (issue 16): two slurmd nodes n1, n2 on this host under one slurmctld; a grid spread over both;
  n2 dies mid-grid (its slurmd, slurmstepds and trial processes SIGKILLed at once) and is marked DOWN. Its trials
  run again on n1 and every trial completes exactly once, both when Slurm requeues the batch job itself (the
  default, JobRequeue=1) and when the job may not be requeued (`--no-requeue`: NODE_FAIL, and dpx retries it under
  `max_retries`).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from conftest import run_dpx, write_recipe
from test_backend_slurm import FAST, rows_of, slurm, slurm_cluster, slurm_report, wait_for  # noqa: F401

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


@pytest.fixture
def slurm2():
    """A fresh two-node cluster (n1, n2) for each test: the test kills n2."""
    with slurm_cluster(2) as d:
        yield d


def squeue_running() -> dict[str, tuple[str, str]]:
    """{array task id "J_I": (raw job id, node)} of the running jobs."""
    r = subprocess.run(["squeue", "-h", "-r", "-t", "RUNNING", "-o", "%i|%A|%N"], capture_output=True, text=True)
    out = {}
    for line in r.stdout.split():
        task, raw, node = line.split("|")
        out[task] = (raw, node)
    return out


def node_processes(d: str, node: str) -> list[psutil.Process]:
    """Everything that runs "on" `node` of this one-host cluster: its slurmd, the slurmstepd of every job Slurm has
    on it, and every process below those or started with SLURMD_NODENAME=node (batch script, submitit, runner)."""
    procs = [psutil.Process(int(Path(d, f"slurmd-{node}.pid").read_text()))]
    r = subprocess.run(["squeue", "-h", "-w", node, "-o", "%A"], capture_output=True, text=True)
    jobs = set(r.stdout.split())
    # a job's processes of this cluster only (SLURM_CONF as the fixture exports it): a second cluster on the host,
    # another test run, has node names alike. Not for slurmstepd: it rewrites its environ area with its process
    # title, so it is found by the job ids this cluster's squeue lists on the node.
    conf = f"{d}/slurm.conf"
    for p in psutil.process_iter(["cmdline", "environ"]):
        cmd, env = " ".join(p.info["cmdline"] or []), p.info["environ"] or {}
        stepd = cmd.startswith("slurmstepd: [") and cmd[len("slurmstepd: ["):].split(".")[0].split("]")[0] in jobs
        if stepd or (env.get("SLURMD_NODENAME") == node and env.get("SLURM_CONF") == conf):
            procs.append(p)
            try:
                procs += p.children(recursive=True)
            except psutil.Error:
                pass
    return list({p.pid: p for p in procs}.values())


def kill_node(d: str, node: str) -> list[int]:
    """The node dies at once: every process of it is stopped first (so no slurmstepd reports its job's end to
    slurmctld when the job's processes die under it, which would end the job FAILED, not NODE_FAIL), then SIGKILLed;
    a second sweep finds anything started meanwhile. Returns the pids killed."""
    killed: dict[int, psutil.Process] = {}
    for _ in range(2):
        procs = [p for p in node_processes(d, node) if p.pid not in killed]
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for p in procs:
                try:
                    p.send_signal(sig)
                except psutil.Error:
                    pass
        killed.update({p.pid: p for p in procs})
    psutil.wait_procs(list(killed.values()), timeout=10)
    return sorted(killed)


def sacct_records(tasks: list[str]) -> dict[str, list[tuple[str, str]]]:
    """{array task id: [(state, node), ...]}, every record of every run of it (-D: a requeued job's earlier runs),
    once every task's last record has ended: slurmctld sends them to slurmdbd a moment after squeue shows the end."""
    from dpx.orchestrator.backends.slurm import ALIVE

    def ended():
        r = subprocess.run(["sacct", "-D", "-X", "-n", "-P", "-o", "JobID,State,NodeList", "-j",
                            ",".join(sorted({t.split("_")[0] for t in tasks}))], capture_output=True, text=True)
        out: dict[str, list[tuple[str, str]]] = {}
        for line in r.stdout.splitlines():
            jid, state, node = line.split("|")
            if "[" not in jid:  # "12_[5-9]": tasks not started yet
                out.setdefault(jid, []).append((state.split()[0], node))
        return out if all(out.get(t) and out[t][-1][0] not in ALIVE for t in tasks) else None

    return wait_for(ended, 60, f"sacct to record the end of {tasks}")


@pytest.mark.parametrize("requeue", [True, False], ids=["slurm-requeues", "no-requeue-dpx-retries"])
def test_two_node_slurm_cluster_second_node_killed(tmp_path, slurm2, requeue):
    """8 trials of 12 s on two nodes of 2 CPUs each (4 at once, 2 a node). Once n2's two trials run (their runner
    printed its first line), n2 dies (kill_node) and is marked DOWN by `scontrol update state=down`, as a health
    check or an admin would: at once, so the test does not wait out SlurmdTimeout (30 s here, and slurmctld's ping
    cycle on top) and nothing can be scheduled onto the dead node meanwhile (its slots stay taken until it is down).
    - requeue (Slurm's default): slurmctld requeues the batch jobs of a failed node under their own array task ids
      (sacct: NODE_FAIL on n2, then COMPLETED on n1); dpx sees them alive throughout, so the attempt stays 1 and
      dpx must not retry them as well (max_retries: 1 would let it: it would run them twice).
    - `--no-requeue`: the jobs end NODE_FAIL; dpx settles them as `worker lost` and retries them under
      max_retries as attempt 2, a new array task, which runs on n1.
    Either way: every trial completed with its result.json, exactly one `[dpx] completed` line in each log (no
    trial completed twice), as many attempt headers in each log as runs Slurm records for it, and only the killed
    trials ran twice (once cut short on n2, once complete on n1)."""
    from dpx.orchestrator.state import StateStore

    ws = tmp_path / "ws"
    extra = "" if requeue else ", additional_parameters: {no_requeue: true}"
    recipe = write_recipe(tmp_path / "two.yaml", f"""
name: two
task: {{name: debug, steps: 12, sleep_s: 12}}
grid: {{task.value: [1, 2, 3, 4, 5, 6, 7, 8]}}
hardware: {{backend: slurm, cpus_per_trial: 1, max_retries: 1,
           slurm: {{time_min: 10, array_parallelism: 4, mem_gb: 0.25{extra}}}}}
tracking: {{enabled: false}}
""")
    t0 = time.time()
    r = run_dpx("submit", str(recipe), ws=ws, env=FAST)
    assert r.returncode == 0 and "sbatch accepted" in r.stdout, r.stdout + r.stderr
    rows = rows_of(ws, "two")
    job_of = {tid: row["backend_job_id"] for tid, row in rows.items()}
    trial_of = {j: t for t, j in job_of.items()}
    assert len({j.split("_")[0] for j in job_of.values()}) == 1, job_of  # one array
    run_dir = {tid: Path(row["run_dir"]) for tid, row in rows.items()}

    def started(tid: str) -> bool:
        log = run_dir[tid] / "log.txt"
        return log.exists() and f"[dpx] trial {tid} attempt" in log.read_text()

    def both_nodes_running():
        run = squeue_running()
        nodes = {node for _, node in run.values()}
        on_n2 = [trial_of[t] for t, (_, node) in run.items() if node == "n2"]
        return on_n2 if {"n1", "n2"} <= nodes and len(on_n2) == 2 and all(map(started, on_n2)) else None

    victims = set(wait_for(both_nodes_running, 180, "two trials running on n2 and some on n1"))
    killed = kill_node(slurm2, "n2")
    subprocess.run(["scontrol", "update", "nodename=n2", "state=down", "reason=killed"], check=True)
    t_kill = time.time() - t0

    def done():
        subs = StateStore(ws / "state.db").submissions("two")
        return subs and all(s["state"] == "done" for s in subs)

    wait_for(done, 300, "the grid to end after n2 died")
    rows = rows_of(ws, "two")
    assert {t: r["status"] for t, r in rows.items()} == dict.fromkeys(rows, "completed"), \
        {t: (r["status"], r["error"]) for t, r in rows.items()}
    assert len(rows) == 8
    records = sacct_records(list(job_of.values()))
    for tid, row in rows.items():
        res = json.loads((run_dir[tid] / "result.json").read_text())
        assert res["status"] == "completed" and res["attempt"] == row["attempts"], res
        log = (run_dir[tid] / "log.txt").read_text()
        assert log.count("[dpx] completed:") == 1, log  # completed once, never twice
        headers = log.count("===== attempt")
        victim = tid in victims
        if requeue:  # one attempt; Slurm restarted the killed ones under the same array task
            assert row["attempts"] == 1 and row["backend_job_id"] == job_of[tid], row
            runs = records[job_of[tid]]
            want = [("NODE_FAIL", "n2"), ("COMPLETED", "n1")] if victim else [("COMPLETED", runs[-1][1])]
            assert runs == want, (tid, runs, slurm_report())
            assert headers == len(runs), (tid, log)
            if victim:  # cut short on n2, then the whole trial again on n1
                assert "restart 0)" in log.split("===== attempt")[1] and "restart 1)" in log, log
        else:  # dpx retried the killed ones: attempt 2 in a new array task, on n1
            assert row["attempts"] == (2 if victim else 1), row
            assert headers == row["attempts"], (tid, log)
            runs = records[job_of[tid]]
            assert runs == ([("NODE_FAIL", "n2")] if victim else [("COMPLETED", runs[0][1])]), (tid, runs)
            if victim:
                new = row["backend_job_id"]
                assert new != job_of[tid] and sacct_records([new])[new] == [("COMPLETED", "n1")], new
                ev = [e["detail"] or "" for e in StateStore(ws / "state.db").events("two", tid)]
                assert any("worker lost" in d and "NODE_FAIL" in d for d in ev), ev
        assert "restart 2)" not in log, log
    on_n2 = {trial_of[t] for t, runs in records.items() if any(node == "n2" for _, node in runs)}
    assert on_n2 == victims, (on_n2, victims, records)  # n2 ran nothing but the two killed trials
    assert subprocess.run(["squeue", "-h"], capture_output=True, text=True).stdout.strip() == ""
    print(f"\n[slurm 2 nodes, {'requeue' if requeue else 'no-requeue'}] killed n2 at {t_kill:.0f} s "
          f"({len(killed)} processes; its trials {sorted(victims)}); all 8 completed at {time.time() - t0:.0f} s")
