"""One trial per GPU, on CPU with stand-in GPUs: `gpus_per_trial: 1` on a 2-GPU node runs two trials at once, each
seeing its own GPU through CUDA_VISIBLE_DEVICES (set by Ray for its tasks, by the local backend from the GPUs it
was given), and every trial's environment keeps NVLink multicast off."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import write_recipe

SAFE = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


def submit_watching_envs(recipe: Path, ws: Path, env: dict, timeout: float) -> tuple[int, str, list[dict]]:
    """`dpx submit --wait`, reading the environment of every trial process (runner) seen while it runs."""
    e = {**{k: v for k, v in os.environ.items() if k not in SAFE}, **env, "DPX_WORKSPACE": str(ws)}
    p = subprocess.Popen([sys.executable, "-m", "dpx.orchestrator.cli", "submit", str(recipe), "--wait"], env=e,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    envs: dict[int, dict] = {}
    deadline = time.time() + timeout
    while p.poll() is None and time.time() < deadline:
        for q in psutil.process_iter(["cmdline"]):
            cmd = q.info["cmdline"] or []
            if q.pid not in envs and "dpx.orchestrator.trial.runner" in cmd and any(str(ws) in c for c in cmd):
                try:
                    envs[q.pid] = q.environ()
                except psutil.Error:
                    pass
        time.sleep(0.3)
    out = p.communicate(timeout=max(1.0, deadline - time.time()))[0]
    return p.returncode, out, list(envs.values())


def results(ws: Path, recipe: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((ws / "runs" / recipe).glob("*/result.json"))]


def overlap(a: dict, b: dict) -> float:
    return min(a["ended_at"], b["ended_at"]) - max(a["started_at"], b["started_at"])


def check_one_gpu_each(res: list[dict], n: int, sleep_s: float) -> None:
    assert len(res) == n and all(r["status"] == "completed" for r in res)
    assert all(r["cuda_visible_devices"] in ("0", "1") for r in res), [r["cuda_visible_devices"] for r in res]
    for i, a in enumerate(res):
        for b in res[i + 1:]:
            if overlap(a, b) > 0:  # ran at the same time: never on the same GPU
                assert a["cuda_visible_devices"] != b["cuda_visible_devices"]
    assert overlap(res[0], res[1]) > sleep_s / 2, "two GPUs, gpus_per_trial 1: the first two ran concurrently"


def check_safe_env(envs: list[dict], n: int) -> None:
    assert len(envs) >= n, f"saw {len(envs)} trial processes"
    for e in envs:
        assert {k: e.get(k) for k in SAFE} == SAFE  # NVLink multicast off in every trial


TASK = "{name: debug, steps: 4, sleep_s: %s}"


def test_local_backend_hands_each_trial_its_own_gpu(tmp_path):
    """Three trials on two (stand-in) GPUs: two at once, each on its own; the third waits for a free GPU."""
    ws = tmp_path / "ws"
    recipe = write_recipe(tmp_path / "lg.yaml", f"""
name: lg
task: {TASK % 4}
grid: {{task.value: [1, 2, 3]}}
hardware: {{gpus_per_trial: 1}}
tracking: {{enabled: false}}
""")
    # plain processes (no fork server), so each trial's environment is readable from /proc
    code, out, envs = submit_watching_envs(recipe, ws, {"CUDA_VISIBLE_DEVICES": "0,1", "DPX_FORKSERVER": "0"}, 300)
    assert code == 0, out
    res = sorted(results(ws, "lg"), key=lambda r: r["started_at"])
    check_one_gpu_each(res, 3, 4)
    check_safe_env(envs, 3)
    assert overlap(res[0], res[2]) <= 0.5 or overlap(res[1], res[2]) <= 0.5  # never three at once


def test_local_max_parallel_above_the_gpus_queues_instead_of_starting_gpu_less_trials(tmp_path):
    """The table3 gpu_small run of 2026-12-01: max_parallel 3, gpus_per_trial 1, one GPU. Two trials started with an
    empty CUDA_VISIBLE_DEVICES and failed ("No CUDA GPUs are available"). Now the driver says so and runs one at a
    time, each on GPU 0."""
    ws = tmp_path / "ws"
    recipe = write_recipe(tmp_path / "lq.yaml", f"""
name: lq
task: {TASK % 0.5}
grid: {{task.value: [1, 2, 3]}}
hardware: {{gpus_per_trial: 1, max_parallel: 3}}
tracking: {{enabled: false}}
""")
    code, out, _ = submit_watching_envs(recipe, ws, {"CUDA_VISIBLE_DEVICES": "0"}, 300)
    assert code == 0, out
    res = sorted(results(ws, "lq"), key=lambda r: r["started_at"])
    assert len(res) == 3 and all(r["status"] == "completed" and r["cuda_visible_devices"] == "0" for r in res), res
    assert all(overlap(a, b) <= 0 for i, a in enumerate(res) for b in res[i + 1:])  # one at a time
    log = "".join(p.read_text() for p in (ws / "drivers").glob("*.log"))
    assert "hardware.max_parallel 3, but 1 GPU(s) at gpus_per_trial 1 hold 1 trial(s) at once" in log, log[-2000:]


def test_local_fractional_gpus_share_a_gpu(tmp_path):
    """gpus_per_trial 0.5 on two (stand-in) GPUs: four trials at once, two on each GPU, never three on one."""
    ws = tmp_path / "ws"
    recipe = write_recipe(tmp_path / "lf.yaml", f"""
name: lf
task: {TASK % 3}
grid: {{task.value: [1, 2, 3, 4, 5]}}
hardware: {{gpus_per_trial: 0.5}}
tracking: {{enabled: false}}
""")
    code, out, _ = submit_watching_envs(recipe, ws, {"CUDA_VISIBLE_DEVICES": "0,1"}, 300)
    assert code == 0, out
    res = sorted(results(ws, "lf"), key=lambda r: r["started_at"])
    assert len(res) == 5 and all(r["status"] == "completed" for r in res)
    assert sorted(r["cuda_visible_devices"] for r in res[:4]) == ["0", "0", "1", "1"], res
    for r in res:  # at any trial's start, at most two trials share its GPU
        t = r["started_at"] + 0.01
        same = [x for x in res if x["cuda_visible_devices"] == r["cuda_visible_devices"]
                and x["started_at"] <= t < x["ended_at"]]
        assert len(same) <= 2, (r, same)


def test_local_adopted_trial_keeps_the_gpu_its_worker_recorded(tmp_path, monkeypatch):
    """A new driver adopting a running attempt counts the GPU that attempt's worker.json names as taken (a forked
    trial's /proc environ would show the fork server's), so the next trial gets the other GPU."""
    from dpx.orchestrator.backends.local import LocalBackend
    from dpx.orchestrator.hardware import HardwareConfig
    from dpx.orchestrator.trial.worker import register, registered
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    register(tmp_path, 3)  # this process stands in for the running trial, on GPU 1
    assert registered(tmp_path, 3)["cuda_visible_devices"] == "1"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv("DPX_FORKSERVER", "0")
    be = LocalBackend(HardwareConfig(gpus_per_trial=1), tmp_path)
    assert be.capacity() == 2
    assert be.adopt("r", "t", str(os.getpid()), tmp_path, 3)
    assert be.capacity() == 1 and be.gpus.take() == ["0"]


def test_gpu_pool_whole_and_fractional_shares():
    from dpx.orchestrator.backends.local import GpuPool
    p = GpuPool(["0", "1", "2"], 2)  # two whole GPUs a trial: one trial fits three GPUs
    assert (p.holds(), p.fits()) == (1, 1)
    assert p.take() == ["0", "1"] and p.fits() == 0 and p.take() == []
    p.give_back(["0", "1"])
    assert p.fits() == 1
    q = GpuPool(["0", "1"], 0.25)
    assert q.holds() == 8
    got = [q.take()[0] for _ in range(8)]
    assert sorted(got) == ["0"] * 4 + ["1"] * 4 and got[:2] == ["0", "1"]  # spread, then fill
    assert q.take() == [] and q.fits() == 0
    q.give_back(["1"])
    assert q.fits() == 1 and q.take() == ["1"]
    r = GpuPool(["0", "1"], 1)
    assert r.claim(["1", "7"]) == ["1"] and r.take() == ["0"] and r.take() == []  # an adopted trial holds GPU 1
    assert GpuPool(["0"], 0.3).holds() == 3


@pytest.mark.slow
def test_ray_runs_one_trial_per_gpu_with_its_own_cuda_visible_devices(tmp_path):
    """A local Ray instance with 2 stand-in GPUs (num_gpus: 2 on a CPU machine): Ray assigns GPU ids 0 and 1 to
    the two concurrent trials and the trial subprocess sees them in CUDA_VISIBLE_DEVICES."""
    ws = tmp_path / "ws"
    recipe = write_recipe(tmp_path / "rg.yaml", f"""
name: rg
task: {TASK % 8}
grid: {{task.value: [1, 2]}}
hardware: {{backend: ray, gpus_per_trial: 1, ray: {{num_cpus: 2, num_gpus: 2}}}}
tracking: {{enabled: false}}
""")
    code, out, envs = submit_watching_envs(recipe, ws, {}, 400)
    assert code == 0, out
    res = sorted(results(ws, "rg"), key=lambda r: r["started_at"])
    check_one_gpu_each(res, 2, 8)
    check_safe_env(envs, 2)
    assert {r["cuda_visible_devices"] for r in res} == {"0", "1"}



@pytest.mark.slow
def test_ray_trial_with_two_gpus_runs_as_two_ranks(tmp_path):
    """gpus_per_trial: 2 under Ray (2 stand-in GPUs): Ray gives the trial both GPU ids, the runner re-runs itself
    under torchrun with 2 ranks (gloo here, no CUDA), and rank 0 alone writes the result."""
    ws = tmp_path / "ws"
    recipe = write_recipe(tmp_path / "rd.yaml", f"""
name: rd
task: {TASK % 2}
hardware: {{backend: ray, gpus_per_trial: 2, ray: {{num_cpus: 2, num_gpus: 2}}}}
tracking: {{enabled: false}}
""")
    code, out, envs = submit_watching_envs(recipe, ws, {}, 400)
    assert code == 0, out
    (res,) = results(ws, "rd")
    assert res["status"] == "completed" and res["cuda_visible_devices"] in ("0,1", "1,0")
    log = (ws / "runs" / "rd" / res["trial_id"] / "log.txt").read_text()
    assert "data-parallel trial: 2 processes" in log and log.count("[dpx] trial ") == 2, log[-2000:]
    check_safe_env(envs, 1)
