"""benchmarks/lm_throughput.py on the CPU (tiny shape): the dpx rows are measured and consistent, fla is skipped
with its reason when it does not import, the budget stops new work, and the JSON is written."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "lm_throughput.py"


def _run(out: Path, *args: str) -> dict:
    p = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--device", "cpu", "--warmup", "1",
                        "--steps", "2", "--layer-iters", "2", *args], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads((out / "lm_throughput.json").read_text())


def test_cpu_dry_run_measures_dpx_and_explains_fla(tmp_path):
    r = _run(tmp_path, "--plan", "tiny:g2,tiny:1")
    rows = {(x["variant"], x["impl"]): x for x in r["rows"]}
    assert set(rows) == {("g2", "dpx"), ("g2", "fla"), ("1", "dpx"), ("1", "fla")}
    for v, n_h, gated in (("g2", 2, True), ("1", 1, False)):
        d = rows[(v, "dpx")]
        assert d["status"] == "ok" and (d["n_h"], d["gated"], d["seq_len"], d["batch_size"]) == (n_h, gated, 64, 4)
        m = d["model"]
        assert m["min_s"] <= m["median_s"] <= m["max_s"]
        assert m["tokens_per_s"] == pytest.approx(64 * 4 / m["median_s"])
        assert d["layer"]["ms"] == pytest.approx(1e3 * d["layer"]["median_s"])
        from dpx.kernels.delta_product.chunk import backward_path
        assert d["dpx_backward"] == backward_path(torch.bfloat16, n_h, 32)  # the kernels' choice for bf16 inputs
        f = rows[(v, "fla")]
        if r["fla_error"]:  # fla not installed here: said once, each fla row skipped
            assert f["status"] == "skipped: fla does not import"
        else:  # fla imports (a GPU machine); the same model, so the same parameter count
            assert f.get("num_params") in (None, d["num_params"])
    assert r["env"]["commit"] and r["env"]["device"] == "cpu"


def test_budget_stops_new_work(tmp_path):
    r = _run(tmp_path, "--plan", "tiny:g2,tiny:g3", "--impls", "dpx", "--budget-s", "0.001")
    st = [x["status"] for x in r["rows"]]
    assert st[0].startswith("not finished: budget spent") and st[1] == "not finished: budget spent before start"
    assert all("model" not in x for x in r["rows"])
