"""benchmarks/kernels.py's autotune reset: every dpx Triton autotuner (also under @triton.heuristics) forgets its
picks, so each timed row tunes at its own shape (the H200 stage table of session 9 had fwd_h tuned at B=1, T=1024
and reused at B=4, T=4096: 0.568 ms against 0.408)."""
from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "kernels.py"
sys.path.insert(0, str(SCRIPT.parent))
from dpx_checkout import load_script  # noqa: E402  (benchmarks/: a script by path)


def _load():
    return load_script(SCRIPT, "dpx_bench_kernels")


def _fake_dpx_kernels(monkeypatch):
    """Two autotuned kernels in a fake dpx.kernels module: `wrapped` under @triton.heuristics (two configs), `bare`
    (one config); and `elsewhere`, autotuned too, in a module outside dpx."""
    @triton.heuristics({"X": lambda a: 1})
    @triton.autotune(configs=[triton.Config({"B": 16}), triton.Config({"B": 32})], key=["n"])
    @triton.jit
    def wrapped(x, n, B: tl.constexpr, X: tl.constexpr):
        pass

    @triton.autotune(configs=[triton.Config({"B": 16})], key=["n"])
    @triton.jit
    def bare(x, n, B: tl.constexpr):
        pass

    @triton.autotune(configs=[triton.Config({"B": 16})], key=["n"])
    @triton.jit
    def elsewhere(x, n, B: tl.constexpr):
        pass

    mod = types.ModuleType("dpx.kernels._bench_fake")
    mod.wrapped, mod.bare, mod.not_a_kernel = wrapped, bare, 3
    other = types.ModuleType("not_dpx_fake")
    other.elsewhere = elsewhere
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setitem(sys.modules, other.__name__, other)
    return wrapped, bare, elsewhere


def test_reset_dpx_autotune_clears_every_kernel_cache(monkeypatch):
    bench = _load()
    wrapped, bare, elsewhere = _fake_dpx_kernels(monkeypatch)
    pick = triton.Config({"B": 32})
    wrapped.fn.cache[(4,)] = bare.cache[(4,)] = elsewhere.cache[(4,)] = pick
    assert bench.reset_dpx_autotune() >= 2
    assert wrapped.fn.cache == {} and bare.cache == {}
    assert elsewhere.cache == {(4,): pick}  # only dpx's kernels are reset
    assert bench.reset_dpx_autotune() == 0  # nothing left to forget


def test_dpx_autotune_picks_names_each_kernel_and_its_config(monkeypatch):
    # the row records which config each dpx kernel ran with (the inv pick at n_h = 3 moved between two H200 runs)
    bench = _load()
    wrapped, bare, elsewhere = _fake_dpx_kernels(monkeypatch)
    wrapped.fn.cache[(4,)] = triton.Config({"B": 32}, num_warps=2, num_stages=1)
    elsewhere.cache[(4,)] = triton.Config({"B": 16})
    picks = bench.dpx_autotune_picks()
    assert set(picks.get("wrapped", {})) == {"(4,)"}
    assert "B: 32" in picks["wrapped"]["(4,)"] and "num_warps: 2" in picks["wrapped"]["(4,)"]
    assert "bare" not in picks  # never tuned: no pick to report
    assert "elsewhere" not in picks  # not a dpx kernel
    wrapped.fn.configs_timings = {wrapped.fn.configs[0]: [0.5, 0.4, 0.6]}  # what Triton keeps of a tuning
    assert list(bench.dpx_autotune_picks()["wrapped"]["timings"].values()) == [[0.5, 0.4, 0.6]]
