"""Shared fixtures. Environment for every test: Ray without token auth, MLflow without telemetry."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
if not os.environ.get("DPX_TEST_CUDA"):
    # the interpreter for every in-process Triton kernel on the CPU, set before any test module imports triton: the
    # kernel test files set it too, but a file that imports triton first (test_kernels_bench_script.py before
    # test_walk_proto.py, run alone) used to fix the compiled mode for the whole process
    os.environ["TRITON_INTERPRET"] = "1"

REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"


def run_dpx(*args: str, ws: Path | None = None, cwd: Path | None = None, timeout: float = 300,
            env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess (as a user would), returning the completed process."""
    e = {**os.environ, **(env or {})}
    if ws is not None:
        e["DPX_WORKSPACE"] = str(ws)
    return subprocess.run([sys.executable, "-m", "dpx.orchestrator.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env=e)


@pytest.fixture
def one_thread():
    """One intra-op thread: on a shared 2-core machine torch's default thread pool oversubscribes the cores and
    runs tiny models ~10x slower (measured: 3 s vs 27 s for the word-problem task test at load 8)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return tmp_path / "ws"


@pytest.fixture
def dpx():
    return run_dpx


def write_recipe(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def fake_install(site: Path, package: str, files: dict[str, str], entry_points: str) -> Path:
    """An installed distribution without pip: `site/package/<files>` and a dist-info holding `entry_points`
    (entry_points.txt text); put `site` on PYTHONPATH and importlib.metadata finds its entry points."""
    pkg = site / package
    pkg.mkdir(parents=True)
    for name, text in files.items():
        (pkg / name).write_text(text)
    info = site / f"{package}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package.replace('_', '-')}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)
    return site
