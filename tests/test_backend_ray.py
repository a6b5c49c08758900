"""Ray backend against a real Ray head (`ray start --head` on this machine, its own temp dir and ports).

The head runs in its own process group and is stopped by that group id, never with `ray stop` (which kills every
Ray process on the machine, other people's included).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from conftest import run_dpx, write_recipe

RAY = str(Path(sys.executable).with_name("ray"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_group(proc: subprocess.Popen, grace: float = 15) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            time.sleep(1)  # children of the group exit right after the `ray start --block` parent
        except subprocess.TimeoutExpired:
            pass


def start_head(tmp: str) -> tuple[subprocess.Popen, dict] | None:
    port, client_port = free_port(), free_port()
    cmd = [RAY, "start", "--head", "--block", f"--port={port}", "--num-cpus=2", "--num-gpus=0", f"--temp-dir={tmp}",
           "--include-dashboard=false", "--disable-usage-stats", f"--ray-client-server-port={client_port}",
           f"--dashboard-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
           f"--dashboard-agent-grpc-port={free_port()}", f"--runtime-env-agent-port={free_port()}",
           f"--metrics-export-port={free_port()}"]
    proc = ray_start_blocking(cmd, Path(tmp) / "head.log")
    return None if proc is None else (proc, {"gcs": f"127.0.0.1:{port}", "client": f"ray://127.0.0.1:{client_port}"})


def ray_start_blocking(cmd: list[str], log: Path) -> subprocess.Popen | None:
    """`ray start --block ...` in its own process group, logging to `log`; the process once Ray says it is up
    ("block forever"), or None (stopped) if it did not come up within 150 s."""
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    deadline = time.time() + 150
    while time.time() < deadline and proc.poll() is None:
        if "block forever" in log.read_text():
            return proc
        time.sleep(0.5)
    stop_group(proc)
    return None


@pytest.fixture(scope="module")
def ray_head():
    tmp = tempfile.mkdtemp(prefix="dpxray", dir="/tmp")  # short: Ray's unix socket paths live under it
    # two tries: Ray gives a starting node a fixed 30 s to register, which a loaded machine can miss
    started = start_head(tmp) or start_head(tmp)
    if started is None:
        pytest.fail(f"ray head did not come up: {(Path(tmp) / 'head.log').read_text()[-2000:]}")
    proc, addresses = started
    yield addresses
    stop_group(proc)
    shutil.rmtree(tmp, ignore_errors=True)


def wait_done(ws: Path, recipe: str, timeout: float = 180) -> list[dict]:
    from dpx.orchestrator.driver.liveness import driver_alive
    from dpx.orchestrator.state import StateStore

    store = StateStore(ws / "state.db")
    deadline = time.time() + timeout
    while time.time() < deadline:
        rows = [dict(r) for r in store.trials(recipe=recipe)]
        subs = store.submissions(recipe)
        if rows and not any(driver_alive(s) for s in subs) and all(r["status"] not in ("pending", "running")
                                                                  for r in rows):
            return rows
        time.sleep(0.5)
    raise AssertionError(f"{recipe} not done after {timeout}s: {[(r['trial_id'], r['status']) for r in rows]}")


def runner_of(run_dir: Path, timeout: float = 120) -> psutil.Process:
    deadline = time.time() + timeout
    while time.time() < deadline:
        for p in psutil.process_iter(["cmdline"]):
            cmd = p.info["cmdline"] or []
            if "dpx.orchestrator.trial.runner" in cmd and str(run_dir) in cmd:
                return p
        time.sleep(0.2)
    raise AssertionError(f"no runner process for {run_dir}")


@pytest.mark.slow
def test_killed_worker_is_retried_and_others_undisturbed(tmp_path, ray_head):
    """SIGKILL the Ray worker running one trial: that trial comes back as attempt 2 and resumes from its
    checkpoint; the other trial runs once, untouched; the killed attempt's subprocess died with its worker.
    The driver joins through Ray Client (ray://), the other test through the GCS address."""
    ws = tmp_path / "ws"
    recipe = write_recipe(tmp_path / "rk.yaml", f"""
name: rk
task: {{name: debug, steps: 16, sleep_s: 8, checkpoint: true}}
grid: {{task.value: [1, 2]}}
hardware: {{backend: ray, max_retries: 1, ray: {{address: "{ray_head['client']}"}}}}
""")
    r = run_dpx("submit", str(recipe), ws=ws)
    assert r.returncode == 0, r.stderr
    ids = run_dpx("expand", str(recipe), "--format", "ids").stdout.split()
    victim, other = (ws / "runs" / "rk" / i for i in ids)
    runner = runner_of(victim)
    worker = runner.parent()
    assert worker is not None and "ray::" in " ".join(worker.cmdline()), worker.cmdline()
    deadline = time.time() + 60
    while not (victim / "checkpoints" / "last.json").exists() and time.time() < deadline:  # progress to resume
        time.sleep(0.2)
    worker.send_signal(signal.SIGKILL)
    runner.wait(timeout=10)  # PR_SET_PDEATHSIG: no orphan keeps writing the run dir
    rows = {Path(r["run_dir"]).name: r for r in wait_done(ws, "rk")}
    assert rows[victim.name]["status"] == "completed" and rows[victim.name]["attempts"] == 2
    assert rows[other.name]["status"] == "completed" and rows[other.name]["attempts"] == 1
    res = json.loads((victim / "result.json").read_text())
    assert res["attempt"] == 2 and res["metrics"]["resumed_from"] > 0
    assert json.loads((other / "result.json").read_text())["metrics"]["resumed_from"] == 0
    from dpx.orchestrator.state import StateStore

    ev = [e["detail"] for e in StateStore(ws / "state.db").events("rk", victim.name)]
    assert any("worker lost" in (d or "") for d in ev), ev
    assert (victim / "log.txt").read_text().count("===== attempt") == 2


@pytest.mark.slow
def test_timeout_stops_trial_gracefully(tmp_path, ray_head):
    ws = tmp_path / "ws"
    recipe = write_recipe(tmp_path / "rt.yaml", f"""
name: rt
task: {{name: debug, steps: 100, sleep_s: 100}}
hardware: {{backend: ray, timeout_min: 0.4, ray: {{address: "{ray_head['gcs']}"}}}}
tracking: {{enabled: false}}
""")
    r = run_dpx("submit", str(recipe), "--wait", ws=ws, timeout=240, env={"DPX_KILL_GRACE_S": "10"})
    assert r.returncode == 1, r.stdout + r.stderr
    (row,) = wait_done(ws, "rt")
    assert row["status"] == "failed" and "timed out" in row["error"]
    run_dir = Path(row["run_dir"])
    # the trial got SIGTERM (not a kill): it saw should_stop() and reported a preemption in its own log,
    # far from its natural end (100 steps of 1 s)
    assert "preempted, checkpoint saved: stopped at step" in (run_dir / "log.txt").read_text()
    steps = [json.loads(ln)["step"] for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert 0 < len(steps) < 60


def test_bad_ray_input_is_one_line_and_queues_nothing(tmp_path):
    ws = tmp_path / "ws"
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    recipe = write_recipe(tmp_path / "rb.yaml", f"""
name: rb
task: {{name: debug}}
hardware: {{backend: ray, ray: {{address: "127.0.0.1:{dead}"}}}}
""")
    r = run_dpx("submit", str(recipe), ws=ws)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "unreachable" in r.stderr and "hardware.ray.address" in r.stderr
    r = run_dpx("submit", str(recipe), "hardware.ray.address=null", "hardware.gpus_per_trial=4", ws=ws)
    assert r.returncode == 2 and "hardware.gpus_per_trial" in r.stderr and "GPU" in r.stderr, r.stderr
    assert not (ws / "state.db").exists()


@pytest.mark.slow
def test_killed_driver_loses_nothing(tmp_path, ray_head):
    """On a cluster the trial actors are detached: SIGKILL the driver mid-run, the trials keep running, and the
    next `dpx submit` adopts them by name; each trial ran exactly once."""
    ws = tmp_path / "ws"
    recipe = write_recipe(tmp_path / "rd.yaml", f"""
name: rd
task: {{name: debug, steps: 10, sleep_s: 10}}
grid: {{task.value: [1, 2]}}
hardware: {{backend: ray, ray: {{address: "{ray_head['gcs']}"}}}}
tracking: {{enabled: false}}
""")
    r = run_dpx("submit", str(recipe), ws=ws)
    assert r.returncode == 0, r.stderr
    ids = run_dpx("expand", str(recipe), "--format", "ids").stdout.split()
    runners = [runner_of(ws / "runs" / "rd" / i) for i in ids]
    from dpx.orchestrator.state import StateStore

    (sub,) = StateStore(ws / "state.db").submissions("rd")
    os.kill(sub["driver_pid"], signal.SIGKILL)
    time.sleep(3)
    assert all(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in runners)  # not fate-shared
    r = run_dpx("submit", str(recipe), "--wait", ws=ws, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = wait_done(ws, "rd")
    assert [r["status"] for r in rows] == ["completed", "completed"] and all(r["attempts"] == 1 for r in rows)
    for r in rows:
        assert (Path(r["run_dir"]) / "log.txt").read_text().count("===== attempt") == 1
