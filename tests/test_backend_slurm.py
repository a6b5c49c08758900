"""Slurm backend against a REAL one-node Slurm cluster (slurmctld, slurmd, slurmdbd + MariaDB for sacct) that
.ci/slurm_up.sh starts from Debian's packages in a private folder; .ci/slurm_down.sh stops it by pid files.
Skipped, with the reason, only where the packages are missing and cannot be installed (not root, no apt)."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import REPO, run_dpx, write_recipe

pytestmark = pytest.mark.slow

FAST = {"DPX_SLURM_POLL_S": "1", "DPX_KILL_GRACE_S": "30"}


def _have_slurm() -> bool:
    return all(shutil.which(b) or Path(f"/usr/sbin/{b}").exists()
               for b in ("slurmctld", "slurmd", "slurmdbd", "munged", "mariadbd", "sbatch"))


@contextlib.contextmanager
def slurm_cluster(nodes: int = 1):
    """A private cluster of `nodes` slurmd nodes on this host (.ci/slurm_up.sh DIR NODES; one `localhost` node, or
    n1..nN), SLURM_CONF pointing at it meanwhile; stopped by pid files afterwards. Skips where Slurm is missing."""
    if not _have_slurm() and os.geteuid() == 0:
        subprocess.run(["bash", str(REPO / ".ci" / "services")], capture_output=True, timeout=600)
    if not _have_slurm():
        pytest.skip("Slurm packages (slurm-wlm munge slurmdbd mariadb-server) are not installed and could not be "
                    "installed here (needs root and apt: .ci/services)")
    if os.geteuid() != 0:
        pytest.skip("the toy Slurm cluster runs its daemons as root (.ci/slurm_up.sh): run the Slurm tests as root")
    d = tempfile.mkdtemp(prefix="dpxslurm", dir="/tmp")  # short: sockets live there
    r = subprocess.run(["bash", str(REPO / ".ci" / "slurm_up.sh"), d, str(nodes)], capture_output=True, text=True,
                       timeout=180)
    if r.returncode != 0:
        subprocess.run(["bash", str(REPO / ".ci" / "slurm_down.sh"), d], timeout=120)
        pytest.fail(f"slurm_up.sh failed: {r.stdout[-1000:]} {r.stderr[-2000:]}")
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = f"{d}/slurm.conf"
    try:
        yield d
    finally:
        subprocess.run(["bash", str(REPO / ".ci" / "slurm_down.sh"), d], timeout=180)
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def slurm():
    with slurm_cluster(1) as d:
        yield d


def rows_of(ws: Path, recipe: str) -> dict[str, dict]:
    from dpx.orchestrator.state import StateStore

    return {r["trial_id"]: dict(r) for r in StateStore(ws / "state.db").trials(recipe=recipe)}


def squeue_state(job: str) -> str:
    r = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True)
    return r.stdout.strip()


def slurm_report(job: str | None = None) -> str:
    """What Slurm says about the job and the node, and its daemons' log tails: printed when a wait times out,
    so a CI failure names the cause (a drained node, a held job, a scheduler that never ran)."""
    cmds = [["sinfo", "-N", "-o", "%N %T %E"], ["squeue", "-o", "%i %T %r %S"]]
    if job:
        cmds.append(["scontrol", "show", "job", job])
    out = []
    for c in cmds:
        r = subprocess.run(c, capture_output=True, text=True)
        out.append(f"$ {' '.join(c)}\n{r.stdout}{r.stderr}")
    d = Path(os.environ.get("SLURM_CONF", "/nonexistent")).parent
    for f in [d / "slurmctld.log", *sorted(d.glob("slurmd*.log"))]:  # slurmd.log, or slurmd-nI.log per node
        if f.exists():
            out.append(f"--- {f.name} (tail)\n" + "\n".join(f.read_text(errors="replace").splitlines()[-40:]))
    return "\n".join(out)


def wait_for(pred, timeout: float, what: str, job: str | None = None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}\n{slurm_report(job)}")


def test_array_lost_driver_and_rerun_failed(tmp_path, slurm):
    """One array for three trials; `dpx submit` returns once sbatch accepted; the driver is killed mid-run and a
    second `dpx submit` adopts the running jobs (nothing runs twice); the one failed trial is resubmitted alone
    by `dpx rerun --failed`, as a new one-task array, and completes on attempt 2."""
    ws = tmp_path / "ws"
    recipe = write_recipe(tmp_path / "sa.yaml", """
name: sa
task: {name: debug, steps: 4, sleep_s: 3}
grid: {zip: {task.value: [1, 2, 3], task.fail_on_attempts: [0, 1, 0]}}
hardware: {backend: slurm, slurm: {time_min: 10, array_parallelism: 2, mem_gb: 0.25}}
tracking: {enabled: false}
""")
    r = run_dpx("submit", str(recipe), ws=ws, env=FAST)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "sbatch accepted" in r.stdout, r.stdout
    rows = rows_of(ws, "sa")
    jobs = {tid: row["backend_job_id"] for tid, row in rows.items()}
    assert all(j and j.split("_")[0].isdigit() for j in jobs.values()), jobs
    assert len({j.split("_")[0] for j in jobs.values()}) == 1  # one array
    (sub,) = [dict(s) for s in __import__("dpx.orchestrator.state", fromlist=["x"]).StateStore(
        ws / "state.db").submissions("sa")]
    os.kill(sub["driver_pid"], signal.SIGKILL)  # the driver dies; the jobs go on in Slurm
    r = run_dpx("submit", str(recipe), "--wait", ws=ws, env=FAST, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr  # one trial failed
    rows = rows_of(ws, "sa")
    ids = run_dpx("expand", str(recipe), "--format", "ids").stdout.split()
    ok1, bad, ok3 = ids
    assert [rows[t]["status"] for t in ids] == ["completed", "failed", "completed"], rows
    for t in ids:  # adopted, not rerun: one attempt each, one job each
        assert rows[t]["attempts"] == 1 and rows[t]["backend_job_id"] == jobs[t]
        assert (Path(rows[t]["run_dir"]) / "log.txt").read_text().count("===== attempt") == 1
    sacct = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", jobs[bad]],
                           capture_output=True, text=True).stdout
    assert f"{jobs[bad]}|FAILED" in sacct, sacct  # a failed trial fails its array task (not COMPLETED)

    r = run_dpx("rerun", str(recipe), "--failed", "--wait", ws=ws, env=FAST, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    after = rows_of(ws, "sa")
    assert all(after[t]["status"] == "completed" for t in ids)
    assert after[bad]["attempts"] == 2 and after[bad]["backend_job_id"] != jobs[bad]
    assert after[ok1]["backend_job_id"] == jobs[ok1] and after[ok3]["backend_job_id"] == jobs[ok3]
    new_master = after[bad]["backend_job_id"].split("_")[0]
    tasks = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobID", "-j", new_master],
                           capture_output=True, text=True).stdout.split()
    assert len(tasks) == 1, tasks  # only the failed index went out again
    assert json.loads((Path(after[bad]["run_dir"]) / "result.json").read_text())["attempt"] == 2


def test_preempt_and_requeue_resume_from_checkpoint(tmp_path, slurm):
    """USR2 (what Slurm sends on preemption / before the time limit) → submitit's checkpoint hook stops the
    trial, which saves its checkpoint, and requeues the same array task; then `scontrol requeue` (SIGTERM
    straight to the trial) once more. The trial finishes in the same run dir, same attempt, same MLflow run,
    resuming from its checkpoint each time."""
    ws = tmp_path / "ws"
    recipe = write_recipe(tmp_path / "sp.yaml", """
name: sp
task: {name: debug, steps: 24, sleep_s: 24, checkpoint: true}
hardware: {backend: slurm, slurm: {time_min: 10, mem_gb: 0.25}}
""")
    r = run_dpx("submit", str(recipe), ws=ws, env=FAST)
    assert r.returncode == 0, r.stdout + r.stderr
    (row,) = rows_of(ws, "sp").values()
    job, run_dir = row["backend_job_id"], Path(row["run_dir"])
    ck = run_dir / "checkpoints" / "last.json"

    def step() -> int:
        try:
            return json.loads(ck.read_text())["step"]
        except (OSError, ValueError):
            return 0

    def restart(n: int) -> None:
        # A requeued job waits out the credential lifetime (BeginTime; slurm_up.sh sets cred_expire=30 s) and
        # Slurm starts it again by itself. Forcing `StartTime=now` here raced the revocation of the old
        # credential: slurmd refused the launch ("Job credential revoked") and the job FAILED (CI, 2026-11-29).
        wait_for(lambda: squeue_state(job) == "PENDING", 60, f"job {job} requeued", job)
        wait_for(lambda: f"restart {n})" in (run_dir / "log.txt").read_text(), 300, f"restart {n}", job)

    wait_for(lambda: step() >= 3, 180, "first checkpoint")
    subprocess.run(["scancel", "--signal=USR2", job], check=True)
    restart(1)
    first = json.loads((run_dir / "error.json").read_text()) if (run_dir / "error.json").exists() else None
    s1 = step()
    assert s1 >= 3
    wait_for(lambda: step() >= s1 + 2, 120, "progress after the first requeue")
    subprocess.run(["scontrol", "requeue", job], check=True)
    restart(2)
    from dpx.orchestrator.state import StateStore

    wait_for(lambda: StateStore(ws / "state.db").submissions("sp")[-1]["state"] == "done", 240, "the trial to end")
    (end,) = rows_of(ws, "sp").values()
    assert end["status"] == "completed" and end["attempts"] == 1 and end["backend_job_id"] == job
    assert end["mlflow_run_id"] == row["mlflow_run_id"] or row["mlflow_run_id"] is None
    res = json.loads((run_dir / "result.json").read_text())
    assert res["attempt"] == 1 and res["metrics"]["resumed_from"] >= s1 + 2
    log = (run_dir / "log.txt").read_text()
    assert log.count("===== attempt 1") == 3 and log.count("preempted, checkpoint saved") == 2, log
    assert first is None or first["status"] == "preempted"
    # every step was logged once per pass and none was lost: the last loss point is step 23
    steps = [json.loads(ln)["step"] for ln in (run_dir / "metrics.jsonl").read_text().splitlines()
             if json.loads(ln)["key"] == "loss"]
    assert max(steps) == 23 and set(range(24)) <= set(steps)


def test_bad_slurm_input_is_one_line_and_queues_nothing(tmp_path, slurm):
    ws = tmp_path / "ws"
    recipe = write_recipe(tmp_path / "sb.yaml", """
name: sb
task: {name: debug}
hardware: {backend: slurm, slurm: {partition: gpu_big}}
""")
    before = subprocess.run(["squeue", "-h"], capture_output=True, text=True).stdout
    for extra, key, words in (([], "hardware.slurm.partition", "does not exist"),
                              (["hardware.slurm.partition=debug", "hardware.gpus_per_trial=2"],
                               "hardware.gpus_per_trial", "GPU"),
                              (["hardware.slurm.partition=debug", "hardware.cpus_per_trial=64"],
                               "hardware.cpus_per_trial", "CPU"),
                              (["hardware.slurm.partition=debug", "hardware.slurm.mem_gb=100000"],
                               "hardware.slurm", "sbatch rejects")):
        r = run_dpx("submit", str(recipe), *extra, ws=ws)
        assert r.returncode == 2, r.stdout + r.stderr
        assert r.stderr.strip().count("\n") == 0 and key in r.stderr and words in r.stderr, r.stderr
    assert not (ws / "state.db").exists()
    assert subprocess.run(["squeue", "-h"], capture_output=True, text=True).stdout == before
