"""benchmarks/gpu_check.py, the GPU acceptance check, on the CPU: its case list covers what the kernels issue asks
(dtypes x n_h x head dims, shapes, varlen, states, decode) and every kernel shape of every shipped recipe's GPU
scales; one chunk case and one decode case run end to end through the worker process (Triton's interpreter stands
in for the GPU), and the verdict rule fails what it should."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_check  # noqa: E402


def test_matrix_covers_every_dtype_n_h_and_head_dim():
    cases = gpu_check.matrix_cases()
    chunk = [c for c in cases if c["kind"] == "chunk"]
    grid = {(c["dtype"], c["n"], c["K"]) for c in chunk}
    for dt in ("float32", "bfloat16", "float16"):
        for n in (1, 2, 3, 4, 8):
            for K in (32, 64, 85, 128, 256):
                assert (dt, n, K) in grid, (dt, n, K)
    assert {c["gate"] for c in chunk} >= {"rand", "zero", "neg", "mixed", "none"}
    sizes = {(c["B"], c["T"]) for c in chunk}
    assert (512, 32) in sizes and (1, 8192) in sizes
    assert any(c["cu"] and 1 in {b - a for a, b in zip(c["cu"], c["cu"][1:])} for c in chunk)  # a length-1 segment
    assert any(not c["h0"] and not c["ht"] for c in chunk)
    assert {c["n"] for c in cases if c["kind"] == "decode"} >= {1, 2, 3, 4, 8}
    ids = [c["id"] for c in cases]
    assert len(ids) == len(set(ids))


def test_every_gpu_scale_of_every_recipe_is_in_the_check():
    cases, notes = gpu_check.recipe_cases()
    assert not notes, notes
    sources = {c["source"] for c in cases}
    for path in sorted((ROOT / "recipes").glob("*.yaml")):
        raw = yaml.safe_load(path.read_text())
        models = [raw.get("model") or {}]
        for scale in raw.get("scales") or {}:
            if not scale.startswith("gpu"):
                continue
            shapes = gpu_check._recipe_shapes(path, scale)
            if shapes:  # a scale whose trials build a delta-rule model must contribute its shapes
                assert f"{path.stem}:{scale}" in sources, (path.name, scale)
    # the paper's state-tracking shape (12 heads x 32 at n_h = 2 in the full recipe; 4 heads in gpu_small)
    assert any(c["K"] == 32 and c["n"] == 2 and c["source"].startswith("fig5") for c in cases)
    assert any(c["K"] == 85 and c["source"].startswith("table3") for c in cases)  # head-dim matching at n_h = 2


def _worker(case):
    env = {k: v for k, v in os.environ.items() if k != "DPX_KERNEL_BWD_FP32"}
    env["TRITON_INTERPRET"] = "1"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--case", json.dumps(case)],
                       capture_output=True, text=True, env=env, timeout=600)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith(("RESULT ", "ERROR "))), None)
    assert line and line.startswith("RESULT "), r.stdout[-2000:] + r.stderr[-2000:]
    return json.loads(line[7:])


@pytest.mark.parametrize("kind,n,gate,cu", [("chunk", 3, "mixed", [0, 1, 12, 12, 25]), ("decode", 2, "rand", None)])
def test_worker_runs_a_case_against_float64(kind, n, gate, cu):
    c = gpu_check.case(kind=kind, dtype="float32", n=n, K=16, V=16, H=1, B=1 if cu else 2, T=25 if cu else 3,
                       gate=gate, cu=cu, bwd=kind == "chunk")
    row = _worker(c)
    names = set(gpu_check.NAMES) if kind == "chunk" else {"o", "ht"}
    assert set(row["errors"]) == names
    status, bad = gpu_check.judge(c, row)
    assert status == "pass", bad


def test_verdict_fails_what_it_should():
    c = gpu_check.case(dtype="bfloat16", gate="none")
    ok = {"errors": {"o": 4e-3, "dg": 3e-2}, "fla_errors": {"o": 3e-3}}
    assert gpu_check.judge(c, ok)[0] == "pass"  # dg has 4x the tolerance
    assert gpu_check.judge(c, {"errors": {"o": 2e-2}, "fla_errors": {}})[0] == "fail"  # over the bf16 tolerance
    assert gpu_check.judge(c, {"errors": {"o": 9e-3}, "fla_errors": {"o": 2e-3}})[0] == "fail"  # > 2x fla
    assert gpu_check.judge(c, {"errors": {"o": 3e-3}, "fla_errors": {"o": 1e-4}})[0] == "pass"  # well inside
    assert gpu_check.judge(c, {"errors": {"o": float("inf")}, "fla_errors": {}})[0] == "fail"  # NaN/inf output
