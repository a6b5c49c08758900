"""benchmarks/pending/x4_call.sh (the 4-GPU device call) on this machine, as a dry run of its plumbing: the patched
copy imports its own kernels (not the editable install's), the check runs there on one case (interpreter), the
recipe runs from this tree beside it, the speed and diagnostics steps fail or skip without a GPU, and the files
that come back are the six it names (at most 8 may come back from a device call)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "pending" / "x4_call.sh"


def test_syntax():
    r = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.slow
def test_dry_run(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "TRITON_INTERPRET": "1", "OUT": str(out), "X4_COPY": str(tmp_path / "copy"),
           "X4_WORKSPACE": str(tmp_path / "dpx_ws"), "RAY_AUTH_MODE": "disabled", "MLFLOW_DISABLE_TELEMETRY": "true",
           "RECIPE_ARGS": "recipes/quickstart.yaml train.steps=20", "JOBS": "1", "SPEED_S": "30",
           "CHECK_ONLY": "chunk f32 n1 K32V32 H2 2x300 g=rand b<2 h0+ht [matrix]"}
    for k in ("DPX_WS_FROM", "DPX_STOP_AFTER_S", "DPX_WORKSPACE"):
        env.pop(k, None)
    r = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=900, cwd=REPO)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["check.json", "check.md", "check_rows.jsonl", "diag.tgz",
                                                     "dpx_ws.tgz", "logs.tgz"], r.stdout[-2000:]
    summary = json.loads((out / "check.json").read_text())["summary"]
    assert summary["cases"] == 1 and summary["pass"] == 1 and summary["gpus"] == ["0", "1"], summary
    with tarfile.open(out / "logs.tgz") as t:
        patched = t.extractfile("logs/patched.log").read().decode()
        recipe = t.extractfile("logs/recipe.log").read().decode()
    assert f"kernels from {tmp_path / 'copy'}" in patched and "speed: only" in patched  # no time set for speed
    assert "recipe rc 0" in recipe
    with tarfile.open(out / "dpx_ws.tgz") as t:
        assert sum(n.endswith("/result.json") for n in t.getnames()) == 3  # quickstart's three trials
