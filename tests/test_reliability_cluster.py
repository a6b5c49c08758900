"""Beyond one node (issue 16): a two-node Ray cluster on this machine, a head and a second node started with
`ray start --address`, each with its own CPU and a custom resource; trials spread over both; the second node is
SIGKILLed (every process of it) mid-grid. Its trials come back as `worker lost`, are retried on the head under
`max_retries`, and every trial completes; none is lost, none runs more often than its attempts say.

The head has 2 CPUs and the second node 1, the trials 1 CPU each and 3 run at once (the cluster's CPUs), so one
always runs on the second node. The two-node Slurm case is
tests/test_reliability_slurm.py::test_two_node_slurm_cluster_second_node_killed.
"""
from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from conftest import run_dpx, write_recipe
from test_backend_ray import RAY, free_port, ray_start_blocking, start_head, stop_group, wait_done


def start_node(tmp: str, gcs: str) -> subprocess.Popen | None:
    cmd = [RAY, "start", "--block", f"--address={gcs}", "--num-cpus=1", "--num-gpus=0", f"--temp-dir={tmp}",
           "--disable-usage-stats", '--resources={"second": 1}', f"--dashboard-agent-listen-port={free_port()}",
           f"--dashboard-agent-grpc-port={free_port()}", f"--runtime-env-agent-port={free_port()}",
           f"--metrics-export-port={free_port()}"]
    return ray_start_blocking(cmd, Path(tmp) / "node2.log")


def node_processes(proc: subprocess.Popen) -> list[psutil.Process]:
    """The second node: its `ray start` process and everything below it (raylet, workers, their runners)."""
    try:
        root = psutil.Process(proc.pid)
        return [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def runners_below(procs: list[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        try:
            cmd = p.cmdline()
        except psutil.Error:
            continue
        if "dpx.orchestrator.runner" in cmd:
            out += [c for c in cmd if "/runs/" in c]
    return out


@pytest.mark.slow
def test_two_node_ray_cluster_second_node_killed(tmp_path):
    tmp = tempfile.mkdtemp(prefix="dpxray2", dir="/tmp")
    head = node2 = None
    try:
        started = start_head(tmp) or start_head(tmp)
        assert started is not None, (Path(tmp) / "head.log").read_text()[-2000:]
        head, addr = started
        node2 = start_node(tmp, addr["gcs"]) or start_node(tmp, addr["gcs"])
        assert node2 is not None, (Path(tmp) / "node2.log").read_text()[-2000:]
        ws = tmp_path / "ws"
        recipe = write_recipe(tmp_path / "two.yaml", f"""
name: two
task: {{name: debug, steps: 12, sleep_s: 12}}
grid: {{task.value: [1, 2, 3, 4]}}
hardware: {{backend: ray, cpus_per_trial: 1, max_retries: 1, ray: {{address: "{addr['gcs']}"}}}}
tracking: {{enabled: false}}
""")
        r = run_dpx("submit", str(recipe), ws=ws)
        assert r.returncode == 0, r.stderr
        deadline = time.time() + 240
        on_node2: list[str] = []
        while time.time() < deadline and not on_node2:  # a trial running on the second node
            on_node2 = runners_below(node_processes(node2))
            time.sleep(0.5)
        assert on_node2, "no trial ever ran on the second node"
        time.sleep(2)
        victims = {Path(p).name for p in on_node2}
        for p in node_processes(node2):  # the node dies at once, all of it
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass
        rows = {r["trial_id"]: r for r in wait_done(ws, "two", timeout=600)}
        assert len(rows) == 4 and {r["status"] for r in rows.values()} == {"completed"}, \
            {k: (v["status"], v["error"]) for k, v in rows.items()}
        for tid, row in rows.items():
            headers = (ws / "runs" / "two" / tid / "log.txt").read_text().count("===== attempt")
            assert headers == row["attempts"], (tid, headers, row["attempts"])  # no attempt beyond its count
            if tid in victims:
                assert row["attempts"] == 2, row  # lost with its node, retried on the head
        from dpx.orchestrator.state import StateStore

        for tid in victims:
            ev = [e["detail"] for e in StateStore(ws / "state.db").events("two", tid)]
            assert any("worker lost" in (d or "") for d in ev), ev
        print(f"\n[cluster] trials on the killed node: {sorted(victims)}; all 4 completed")
    finally:
        for p in (node2, head):
            if p is not None:
                stop_group(p)
        shutil.rmtree(tmp, ignore_errors=True)
