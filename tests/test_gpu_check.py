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
    sources = {src for c in cases for src in c["sources"]}
    for path in sorted((ROOT / "recipes").glob("*.yaml")):
        from dpx.orchestrator.load import read_recipe
        for scale in read_recipe(path).get("scales") or {}:
            if not scale.startswith("gpu"):
                continue
            shapes = gpu_check._recipe_shapes(path, scale)
            if shapes:  # a scale whose trials build a delta-rule model must contribute its shapes
                assert f"{path.stem}:{scale}" in sources, (path.name, scale)
    # the paper's state-tracking shape (12 heads x 32 at n_h = 2 in the full recipe; 4 heads in gpu_small)
    src = lambda c, name: any(s.startswith(name) for s in c["sources"])
    assert any(c["K"] == 32 and c["n"] == 2 and src(c, "fig5") for c in cases)
    assert any(c["K"] == 85 and src(c, "table3") for c in cases)  # head-dim matching at n_h = 2


def test_every_gpu_scale_builds_its_fused_op_cases():
    # the fused glue (kernels/fused) is in the check at every model shape of every shipped recipe's GPU scales
    cases = gpu_check.fused_recipe_cases()
    ids = [c["id"] for c in cases]
    assert len(ids) == len(set(ids))
    sources = {src for c in cases for src in c["sources"]}
    for path in sorted((ROOT / "recipes").glob("*.yaml")):
        from dpx.orchestrator.load import read_recipe
        for scale in read_recipe(path).get("scales") or {}:
            if scale.startswith("gpu") and list(gpu_check._recipe_trials(path, scale)):
                assert f"{path.stem}:{scale}" in sources, (path.name, scale)
    kinds = {(c["model"]["family"] in gpu_check.DELTA_FAMILIES, c["model"].get("use_short_conv"),
              c["model"].get("use_output_gate")) for c in cases}
    assert {(True, True, False), (True, False, False), (False, None, None)} <= kinds, kinds
    fig4 = [c for c in cases if any(s.startswith("fig4_throughput") for s in c["sources"])]
    assert {c["n"] for c in fig4} == {1, 2, 3} and all(c["K"] == 128 and c["model"]["hidden_size"] == 1024 for c in fig4)


GLUE = dict(family="gated_deltaproduct", hidden_size=48, num_heads=2, head_dim=16, expand_v=1.0, num_householder=2,
            use_short_conv=True, use_output_gate=True, conv_size=4, norm_eps=1e-6)


@pytest.mark.parametrize("model", [GLUE, dict(GLUE, family="deltanet", num_householder=1, use_short_conv=False,
                                                use_output_gate=False)], ids=["conv+gate", "l2"])
def test_worker_runs_a_fused_case_against_float64(model):
    from gpu_check_fused import fused_case
    c = fused_case(model, "float32", 2, 21, "test")
    row = _worker(c)
    ops = ({"conv_q", "conv_k", "conv_v", "conv_q+cache", "conv_k+cache", "conv_v+cache"} if model["use_short_conv"]
           else {"l2_q", "l2_k"}) | {"o_norm", "block_norm"}
    assert {k.split(".")[0] for k in row["errors"]} == ops
    assert gpu_check.judge(c, row) == ("pass", [])


def test_a_wrong_fused_op_fails_its_case(monkeypatch):
    # the same case on the plain forms (no Triton), once as is and once with the gated norm's output 1 % off
    from dpx.kernels import fused
    from gpu_check_fused import fused_case, run_fused_case
    c = dict(fused_case(GLUE, "float32", 2, 21, "test"), impl="torch")
    assert gpu_check.judge(c, run_fused_case(c, gpu_check._rel)) == ("pass", [])
    good = fused.rms_norm_gated
    monkeypatch.setattr(fused, "rms_norm_gated", lambda x, w, g, eps, impl: good(x, w, g, eps, impl=impl) * 1.01)
    status, bad = gpu_check.judge(c, run_fused_case(c, gpu_check._rel))
    assert status == "fail" and any(b.startswith("o_norm.y") for b in bad) and any(b.startswith("block_norm.y")
                                                                                   for b in bad), bad


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
    # a chunk case with a backward also runs its forward under no_grad (the forward that keeps no chunk states)
    names = set(gpu_check.NAMES) | {"o(no_grad)", "ht(no_grad)"} if kind == "chunk" else {"o", "ht"}
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


def test_env_option_parses_and_reaches_the_cases(tmp_path, monkeypatch):
    assert gpu_check.parse_env(["DPX_KERNEL_DQKWG=split", "A_B=x=y", "A_B=z"]) == {"DPX_KERNEL_DQKWG": "split",
                                                                                  "A_B": "z"}
    for bad in ("NOEQUALS", "=x", "1A=x", "A-B=x"):
        with pytest.raises(ValueError, match="--env: expected NAME=VALUE"):
            gpu_check.parse_env([bad])
    # the driver with one small chunk case and --env: the case's process ran the split kernels, rows and summary say
    # so (monkeypatch restores the variables the driver sets in this process)
    c = gpu_check.case(dtype="float32", n=2, K=16, V=16, H=1, B=1, T=25, gate="rand", fla=False)
    monkeypatch.setattr(gpu_check, "matrix_cases", lambda: [c])
    monkeypatch.setenv("DPX_KERNEL_DQKWG", "fused")
    monkeypatch.delenv("DPX_KERNEL_BWD_FP32", raising=False)
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--out", str(tmp_path), "--no-recipes", "--no-fla", "--jobs",
                                      "1", "--env", "DPX_KERNEL_DQKWG=split", "--gpus", "3"])
    monkeypatch.setattr(gpu_check, "_GPUS", [])
    with pytest.raises(SystemExit) as e:
        gpu_check.main()
    out = json.loads((tmp_path / "gpu_check.json").read_text())
    assert e.value.code == 0, out
    assert out["summary"]["env"] == {"DPX_KERNEL_DQKWG": "split"} and out["summary"]["pass"] == 1, out["summary"]
    row = out["rows"][0]
    assert row["env"] == {"DPX_KERNEL_DQKWG": "split"} and row["dqkwg_kernel"] == "split", row
    assert row["gpu"] == "3" and out["summary"]["gpus"] == ["3"]  # --gpus: the case's CUDA_VISIBLE_DEVICES
    assert "--env DPX_KERNEL_DQKWG=split" in (tmp_path / "gpu_check.md").read_text()
    # the case was forked from the zygote, and still saw the driver's --env (read at call time)
    assert row["process"] == "zygote", row


def test_zygote_children_report_errors_timeouts_and_switches(monkeypatch):
    """A case forked from the zygote: a case the worker rejects is an ERROR line and exit 3; one that outlasts its
    limit is killed (-9); an import-time switch (the fault-locating reruns') gets a fresh interpreter instead."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delenv("DPX_AUTOTUNE_PIN", raising=False)
    gpu_check.start_zygote()
    bad = dict(gpu_check.case(dtype="float32", n=1, K=16, V=16, H=1, B=1, T=3), dtype="float7")
    res = gpu_check._spawn(bad, {}, timeout=120)
    assert res["rc"] == 3 and "float7" in res["error"], res
    slow = gpu_check.case(dtype="float32", n=2, K=64, V=64, H=2, B=2, T=2000, gate="rand")
    res = gpu_check._spawn(slow, {}, timeout=2)
    assert res["rc"] == -9 and "timeout after 2" in res["error"], res
    ok = gpu_check.case(kind="decode", dtype="float32", n=2, K=16, V=16, H=1, B=2, T=3, gate="rand", bwd=False)
    assert gpu_check._spawn(ok, {}, timeout=120)["row"]["process"] == "zygote"
    res = gpu_check._spawn(ok, {"DPX_AUTOTUNE_PIN": "fused_recurrent_dp_fwd_kernel:0"}, timeout=120)
    assert res["row"]["process"] == "fresh", res


def test_gpus_go_round(monkeypatch):
    monkeypatch.setattr(gpu_check, "_GPUS", ["0", "1"])
    monkeypatch.setattr(gpu_check, "_NEXT_GPU", [0])
    assert [gpu_check._pick_gpu()["CUDA_VISIBLE_DEVICES"] for _ in range(5)] == ["0", "1", "0", "1", "0"]
    monkeypatch.setattr(gpu_check, "_GPUS", [])
    assert gpu_check._pick_gpu() == {}


def test_the_kernels_on_main_passed_a_committed_acceptance_check():
    # kernel work is done when the GPU check passes at its code: a committed benchmarks/results/gpu_check*.json whose
    # every row passed at this tree's kernels_sha, over every case the check builds today (the matrix and the shipped
    # recipes' GPU shapes). A change under kernels/ fails here until its check is committed (benchmarks/pending/ is
    # where such a change waits); a recipe whose GPU scale adds a kernel shape fails here until the check covers it.
    sha = gpu_check.kernels_sha()
    want = {c["id"] for c in gpu_check.matrix_cases() + gpu_check.recipe_cases()[0] + gpu_check.fused_recipe_cases()}
    seen = []
    for f in sorted((ROOT / "benchmarks" / "results").glob("gpu_check*.json")):
        d = json.loads(f.read_text())
        rows = [r for r in d.get("rows", []) if r.get("kernels_sha") == sha]
        passed = {r["id"] for r in rows if r.get("status") == "pass"}
        seen.append(f"{f.name}: {len(passed)} pass at {sha}")
        if want <= passed and not any(r.get("status") != "pass" for r in rows if r["id"] in want):
            return
    raise AssertionError(f"no committed acceptance check covers kernels_sha {sha} ({len(want)} cases): "
                         + "; ".join(seen))


@pytest.mark.parametrize("mib, gpus, want", [("81559", [], {None: 71.7}), ("143771", [], {None: 126.4}),
                                             ("81559\n81559", ["0", "1"], {"0": 71.7, "1": 71.7})])
def test_gpu_memory_comes_from_nvidia_smi(tmp_path, monkeypatch, mib, gpus, want):
    # 16 jobs of 8.5 GiB ran an H100 out of memory in session 22: the schedule packs the cases' estimates into
    # what nvidia-smi reports
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nprintf '{mib}\\n'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert gpu_check.gpu_memory_gib(gpus) == want


def test_no_memory_limit_without_nvidia_smi(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpu_check.gpu_memory_gib([]) is None


def test_memory_estimates_cover_the_measured_peaks():
    # session 27's H100 check recorded 193 cases' peaks: the shape formula (what a case never measured gets) leaves
    # room for the context above every one, and a committed measured peak is used with its margin
    from gpu_check_schedule import CTX_GIB, est_gib
    rows = [r for r in json.loads((ROOT / "benchmarks" / "results" / "gpu_check_s27.json").read_text())["rows"]
            if r.get("gpu_peak_gib") is not None]
    assert len(rows) > 150 and max(r["gpu_peak_gib"] for r in rows) > 20
    low = [r["id"] for r in rows if r["gpu_peak_gib"] > est_gib(r) - CTX_GIB]
    assert not low, low
    peaks = gpu_check.known_peaks()
    r = max(rows, key=lambda r: r["gpu_peak_gib"])
    assert peaks[r["id"]] >= r["gpu_peak_gib"] and est_gib(r, peaks) > CTX_GIB + r["gpu_peak_gib"]


def test_schedule_runs_new_shapes_then_the_longest_timed_cases_first():
    cases = gpu_check.matrix_cases()[:6]
    walls = gpu_check.known_walls()
    assert len(walls) >= 150 and all(w > 0 for w in walls.values())  # every committed case that passed has a time
    ids = [c["id"] for c in cases]
    timed = {ids[0]: 3.0, ids[1]: 90.0, ids[2]: 20.0, ids[3]: 90.5}
    order = [c["id"] for c in gpu_check.in_schedule_order(cases, timed)]
    assert set(order[:2]) == set(ids[4:6])  # untimed first
    assert order[2:] == [ids[3], ids[1], ids[2], ids[0]]
