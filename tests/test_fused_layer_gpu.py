"""benchmarks/layer_gpu.py on the CPU (tiny shape): the measurement rows, the JSON the GPU run will write
(`shape`, `variant`, `dpx_over_fla`), fla's absence explained, and the fla autotune pruning."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "layer_gpu.py"


def test_cpu_dry_run_rows(tmp_path):
    p = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--device", "cpu", "--parts", "measure",
                        "--plan", "tiny:2,tiny:g1", "--warmup", "1", "--steps", "1", "--layer-iters", "1"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads((tmp_path / "lm_throughput_cpu.json").read_text())
    assert [(x["shape"], x["variant"]) for x in r["rows"]] == [("tiny", "2"), ("tiny", "g1")]
    for row in r["rows"]:
        d = row["dpx"]
        assert d["status"] == "ok" and d["model"]["tokens_per_s"] == pytest.approx(4 * 64 / d["model"]["median_s"])
        assert d["layer"]["ms"] > 0 and d["layer_plain"]["ms"] > 0
        assert "dpx_over_fla" in row and "layer_dpx_over_fla" in row
        if r["env"]["fla_error"]:
            assert row["dpx_over_fla"] is None and "fla not measured" in row["fla_note"]
    assert (tmp_path / "lm_throughput_table.md").read_text().count("| tiny |") == 2


def test_prune_fla_autotune(monkeypatch):
    triton = pytest.importorskip("triton")
    import triton.language as tl
    sys.path.insert(0, str(SCRIPT.parent))
    import layer_gpu

    @triton.heuristics({"X": lambda a: 1})
    @triton.autotune(configs=[triton.Config({"BV": bv}, num_warps=w, num_stages=s)
                              for w in (2, 4, 8) for s in (1, 2, 3) for bv in (32, 64)], key=["n"])
    @triton.jit
    def kern(x, n, BV: tl.constexpr, X: tl.constexpr):
        pass
    mod = types.ModuleType("fla_test_ops")
    mod.kern = kern
    monkeypatch.setitem(sys.modules, "fla_test_ops", mod)
    assert layer_gpu.prune_fla_autotune(2) >= 1
    assert [(c.kwargs["BV"], c.num_warps, c.num_stages) for c in kern.fn.configs] == [(32, 4, 2), (64, 4, 2)]


def _run(tmp_path, env_extra, *args, timeout=300):
    import os
    env = {**os.environ, **env_extra}
    p = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--device", "cpu", "--parts", "measure",
                        "--warmup", "1", "--steps", "1", "--layer-iters", "1", *args],
                       capture_output=True, text=True, timeout=timeout, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads((tmp_path / "lm_throughput_cpu.json").read_text())


def test_failed_warmup_worker_skips_its_row(tmp_path):
    """A variant whose warm-up worker died (a kernel fault, simulated) is not run in the measuring process."""
    r = _run(tmp_path, {"DPX_LAYER_GPU_WARM_CPU": "1", "DPX_LAYER_GPU_FAIL_WARM": "tiny:g1:dpx"},
             "--plan", "tiny:g1,tiny:2", "--precompile-jobs", "2")
    st = {x["variant"]: x["dpx"]["status"] for x in r["rows"]}
    assert st["g1"].startswith("skipped: its warm-up worker failed") and "illegal memory access" in st["g1"]
    assert st["2"] == "ok" and r["env"]["warmup"]["tiny:2:dpx"].startswith("ok")


def test_cuda_fault_moves_the_rest_to_a_fresh_process(tmp_path):
    r = _run(tmp_path, {"DPX_LAYER_GPU_FAIL_MEASURE": "tiny:2:dpx"}, "--plan", "tiny:2,tiny:3")
    assert [x["variant"] for x in r["rows"]] == ["2", "3"]
    assert "CUDA error" in r["rows"][0]["dpx"]["status"]
    assert r["rows"][1]["dpx"]["status"] == "ok" and r["rows"][1]["process"].startswith("fresh")


def test_cuda_fault_in_the_op_checks(tmp_path):
    """An op check that faults (simulated): the fused path goes off and profile + measure run in a fresh process,
    into the same folder."""
    import os
    p = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--device", "cpu", "--parts",
                        "check,measure", "--plan", "tiny:2", "--warmup", "1", "--steps", "1", "--layer-iters", "1"],
                       capture_output=True, text=True, timeout=600,
                       env={**os.environ, "DPX_LAYER_GPU_FAIL_OPS": "1"})
    assert p.returncode == 0, p.stderr[-2000:]
    c = json.loads((tmp_path / "fused_checks.json").read_text())
    assert not c["all_ok"] and "DPX_FUSED=0" in c["env"]["fused_disabled"]
    r = json.loads((tmp_path / "lm_throughput_cpu.json").read_text())
    assert r["rows"][0]["dpx"]["status"] == "ok"


def test_cpu_dry_run_compiled_rows(tmp_path):
    # --compile: the dpx model and mixer under torch.compile beside the eager ones (aot_eager here: no C++ compiler
    # needed); the row gets dpx_compiled and the compiled/eager ratio, the table a column
    r = _run(tmp_path, {}, "--plan", "tiny:2", "--compile", "--compile-backend", "aot_eager")
    row = r["rows"][0]
    c = row["dpx_compiled"]
    assert c["status"] == "ok" and c["impl"] == "dpx compiled" and c["model"]["tokens_per_s"] > 0
    assert c["compile_scope"] == "blocks"  # train.compile_scope's default: each block compiled on its own
    assert c["layer"]["ms"] > 0 and row["compiled_over_eager"] > 0 and "layer_compiled_over_eager" in row
    assert "compiled tok/s (/eager, /fla)" in (tmp_path / "lm_throughput_table.md").read_text()


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("g++"), reason="inductor's CPU backend compiles C++ with g++")
def test_compiled_rows_read_the_warm_up_workers_graphs(tmp_path):
    """--compile with warm-up workers: a worker compiles the row's graphs (the mixer alone, one block of the LM) with
    inductor, and the measuring process then finds every one of them in the on-disk caches: FX graph and AOTAutograd
    hits, no miss. (CPU inductor: the worker's compile takes minutes here, the row's warm-up seconds.)"""
    r = _run(tmp_path, {"DPX_LAYER_GPU_WARM_CPU": "1", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
                        "TRITON_CACHE_DIR": str(tmp_path / "triton")},
             "--plan", "tiny:2", "--impls", "dpx", "--compile", "--compile-backend", "inductor", "--precompile-jobs",
             "2", "--precompile-compiled-jobs", "1", "--precompile-s", "500", "--budget-s", "800", timeout=900)
    assert r["env"]["warmup"]["tiny:2:dpxc"].startswith("ok"), r["env"]["warmup"]
    c = r["rows"][0]["dpx_compiled"]
    assert c["status"] == "ok", c
    cache = c["compile_cache"]
    assert cache["fx_graph_miss"] == 0 and cache["aot_autograd_miss"] == 0, cache  # nothing compiled in the row
    assert cache["fx_graph_hit"] >= 2 and cache["aot_autograd_hit"] >= 2, cache  # mixer and block, fwd and bwd


def test_resume_keeps_finished_rows_and_measures_the_rest(tmp_path):
    # a plan longer than one GPU call: the second run keeps the first run's finished rows and measures only the rest
    first = _run(tmp_path / "a", {}, "--plan", "tiny:2")
    assert first["rows"][0]["dpx"]["status"] == "ok"
    p = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "b"), "--device", "cpu", "--parts",
                        "measure", "--plan", "tiny:2,tiny:1", "--warmup", "1", "--steps", "1", "--layer-iters", "1",
                        "--resume", str(tmp_path / "a" / "lm_throughput_cpu.json")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "1 finished rows kept" in p.stdout and "[layer_gpu] tiny:2 (" not in p.stdout and "tiny:1 (" in p.stdout
    r = json.loads((tmp_path / "b" / "lm_throughput_cpu.json").read_text())
    assert [(x["shape"], x["variant"]) for x in r["rows"]] == [("tiny", "2"), ("tiny", "1")]
    assert r["rows"][0] == first["rows"][0] and r["env"]["resumed_from"]["rows"] == ["tiny:2"]


def test_resumed_rows_drops_rows_cut_short(tmp_path):
    sys.path.insert(0, str(SCRIPT.parent))
    import layer_gpu
    ok = {"status": "ok"}
    rep = {"fla_rows": {"fig4:2": ok, "fig4:1": {"status": "not finished: budget spent before start"}},
           "rows": [{"shape": "fig4", "variant": "2", "dpx": ok, "dpx_compiled": ok, "fla_ref": ok},
                    {"shape": "fig4", "variant": "g2", "dpx": ok, "dpx_compiled": ok, "fla_ref": ok},
                    {"shape": "fig4", "variant": "1", "dpx": ok, "dpx_compiled": {"status": "not finished: x"},
                     "fla_ref": {"status": "not finished: y"}},
                    {"shape": "fig4", "variant": "3", "dpx": {"status": "failed: CUDA"}},
                    {"shape": "tiny", "variant": "2", "dpx": ok, "dpx_compiled": ok}]}  # fla absent
    f = tmp_path / "r.json"
    f.write_text(json.dumps(rep))
    rows, fla = layer_gpu.resumed_rows(str(f), compiled=True)
    assert list(rows) == ["fig4:2", "fig4:g2", "tiny:2"] and list(fla) == ["fig4:2"]
    rows, _ = layer_gpu.resumed_rows(str(f), compiled=False)
    assert list(rows) == ["fig4:2", "fig4:g2", "tiny:2"]  # fig4:1's fla was cut short: measured again
    assert layer_gpu.resumed_rows("", True) == ({}, {})


def test_resumed_rows_of_another_gpu_are_measured_again(tmp_path, capsys):
    # rows of another card are not anchors for this run's: the resumed fla rows would be divided into new dpx rows
    sys.path.insert(0, str(SCRIPT.parent))
    import layer_gpu
    ok = {"status": "ok"}
    rep = {"env": {"gpu": "NVIDIA H200"}, "fla_rows": {"table3:1": ok},
           "rows": [{"shape": "table3", "variant": "1", "dpx": ok, "dpx_compiled": ok, "fla_ref": ok}]}
    f = tmp_path / "r.json"
    f.write_text(json.dumps(rep))
    assert layer_gpu.resumed_rows(str(f), True, "NVIDIA H100 80GB HBM3") == ({}, {})
    assert "measured on NVIDIA H200" in capsys.readouterr().out
    rows, fla = layer_gpu.resumed_rows(str(f), True, "NVIDIA H200")
    assert list(rows) == ["table3:1"] and list(fla) == ["table3:1"]
