"""GPU acceptance check of the DeltaProduct kernels: every case against a float64 reference, autotuning on.

    python3 benchmarks/gpu_check.py --out DIR [--jobs 6] [--only SUBSTR] [--no-recipes] [--no-fla]
                                    [--env NAME=VALUE ...]   (e.g. --env DPX_KERNEL_DQKWG=split)

Each case runs in its own process, so a fault fails one row, not the run: forked from a zygote that imported torch,
triton and the kernels once (--no-zygote: a fresh `--case JSON` interpreter each, as the fault-locating reruns
always are). A case runs the Triton
chunk kernel (forward + backward: o, final state, dq, dk, dv, dbeta, dg, dh0) or the decode kernel (o, state)
with the autotuner as users get it, and compares against PyTorch's chunkwise form in float64 on the same GPU
(kernels/delta_product/torch_chunk.py, itself tested against the token loop in CI), fed the same inputs rounded to
the case's dtype, so the error is the kernel's arithmetic. Phase 1 runs every case with dpx alone; phase 2 runs
the 16-bit cases without a gate at head dims 64/128 again beside fla-core's `chunk_gated_delta_product` on the
same inputs (fla's gated backward does not run on Triton 3.6), on a small pool with a longer limit, because
fla's first-call autotuning takes minutes (run 3 of 2026-12-01 lost its budget to it with fla in the main pool);
a 16-bit output must then be within 2x fla's error (or well inside the dtype's tolerance).
A case that dies is rerun with blocking launches and DPX_KERNEL_SYNC=1, which names the kernel that faulted, and
then once per autotune config of that kernel (DPX_AUTOTUNE_PIN), which names the configs that fault.

The matrix: float32 / bfloat16 / float16 x n_h 1, 2, 3, 4, 8 x head dims 32, 64, 85, 128, 256 (gates rotating
through random, exactly zero, very negative, mixed zero/-30 and none), batch x length from 512 x 32 to 1 x 8192,
varlen with a length-1 (and an empty) segment, without initial/final state, the decode kernel; plus every kernel
shape that a shipped recipe's GPU scales build (training: forward + backward at the micro-batch x training length;
evaluation: forward at the longest evaluated length), derived by expanding the recipes with dpx itself; and the
fused glue ops of kernels/fused (short conv + L2 norm, gated RMSNorm, the block norm) at every model shape of those
scales, on the model's own tensor layouts, against their PyTorch forms in float64 (gpu_check_fused.py), so a change
anywhere under kernels/ (the kernels_sha) is checked by cases that run it.
--env NAME=VALUE (repeatable) sets a variable in every case's process (the kernel switches, DPX_KERNEL_DQKWG=split
say); the summary and every row record them, and a --resume refuses rows run with other --env values.
Writes DIR/gpu_check.json (one row per case with its status) and DIR/gpu_check.md (the table); exit 1 if any fail.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOL = {"float32": 1e-4, "bfloat16": 1.5e-2, "float16": 5e-3}  # relative RMS error; dg gets 4x (a sum of many terms)
FLA_FACTOR = 2.0
SHORT = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}
NAMES = ("o", "ht", "dq", "dk", "dv", "dbeta", "dg", "dh0")
from gpu_check_fused import DELTA_FAMILIES, fused_case, run_fused_case  # noqa: E402  (benchmarks/ is on sys.path)
from gpu_check_schedule import CTX_GIB, est_gib, schedule  # noqa: E402


# ----------------------------------------------------------------------------------------------- the case list
def case(kind="chunk", dtype="bfloat16", n=2, K=64, V=None, H=2, B=2, T=300, gate="rand", cu=None, h0=True,
         ht=True, bwd=True, beta_max=2.0, fla=None, source="matrix", evals=()):
    """One row of the check. evals: [[B, T], ...] forwards (no backward) run after the main comparison in the same
    process, each against the reference (a recipe's evaluation lengths)."""
    V = K if V is None else V
    c = dict(kind=kind, dtype=dtype, n=n, K=K, V=V, H=H, B=B, T=T, gate=gate, cu=cu, h0=h0, ht=ht, bwd=bwd,
             beta_max=beta_max, source=source, evals=[list(e) for e in evals])
    # fla as the anchor where its kernels run and autotune in reasonable time (at head dim 32 its first-call
    # autotuning outlasted a 240-s case limit with 16 cases sharing the machine)
    c["fla"] = (dtype != "float32" and gate == "none" and kind == "chunk" and K in (64, 128)) if fla is None else fla
    cu_s = "" if cu is None else f" cu={len(cu) - 1}seg"
    st = ("h0" if h0 else "") + ("+ht" if ht else "")
    ev = "".join(f" +fwd {b}x{t}" for b, t in c["evals"])
    c["id"] = (f"{kind} {SHORT[dtype]} n{n} K{K}V{V} H{H} {B}x{T} g={gate} b<{beta_max:g}{cu_s} {st or 'nostate'}"
               f"{'' if bwd else ' fwd'}{ev} [{source}]")
    return c


def matrix_cases() -> list[dict]:
    rotate = ["rand", "zero", "neg", "mixed", "none"]
    out, i = [], 0
    for dtype in ("float32", "bfloat16", "float16"):
        for n in (1, 2, 3, 4, 8):
            for K in (32, 64, 85, 128, 256):
                if dtype != "float32" and n <= 3 and K in (64, 128):
                    gate = "none"  # 16-bit, no gate: fla runs these too (the 2x-fla rule)
                else:
                    gate = rotate[i % len(rotate)]
                    i += 1
                out.append(case(dtype=dtype, n=n, K=K, T=300 if K <= 128 else 150, gate=gate))
    # batch x length: the shapes that faulted in issue 14 (16-bit, head dim 32, many short sequences), one long one
    out.append(case(dtype="bfloat16", n=2, K=32, H=4, B=512, T=32, gate="none", fla=False))
    for n in (2, 3):
        out.append(case(dtype="bfloat16", n=n, K=32, H=4, B=8, T=128, gate="rand"))
    for n in (1, 2, 3):
        out.append(case(dtype="bfloat16", n=n, K=128, H=2, B=1, T=8192, gate="rand"))
    out.append(case(dtype="float32", n=2, K=64, H=2, B=1, T=8192, gate="mixed"))
    # varlen with a length-1 segment and an empty one
    for dtype, n in (("float32", 2), ("float32", 3), ("bfloat16", 1), ("bfloat16", 3)):
        out.append(case(dtype=dtype, n=n, K=64, B=1, T=400, gate="mixed", cu=[0, 1, 150, 150, 333, 400]))
    # no initial state, no final-state gradient; beta in [0, 1]
    for dtype, n in (("float32", 1), ("bfloat16", 3)):
        out.append(case(dtype=dtype, n=n, K=128, T=200, gate="rand", h0=False, ht=False, beta_max=1.0))
    # decode: one token (and a few) from a state
    for dtype in ("float32", "bfloat16"):
        for n, K in ((1, 32), (3, 85), (4, 128), (8, 256)):
            out.append(case(kind="decode", dtype=dtype, n=n, K=K, B=64 if K <= 128 else 8, T=1, gate="rand",
                            bwd=False))
    out.append(case(kind="decode", dtype="float32", n=2, K=64, B=4, T=5, gate="mixed", bwd=False))
    return out


def _recipe_trials(path: Path, scale: str | None):
    """(resolved ModelConfig, dtype, micro-batch, training length, evaluated lengths) of each trial of `recipe x
    scale` that builds a model."""
    from dpx.orchestrator.trials import expand
    from dpx.models.config import ModelConfig
    from dpx.models.matching import resolve
    exp = expand(path, [f"scale={scale}"] if scale else [])
    for t in exp.trials:
        m = t.config.get("model")
        if not m or not m.get("family"):
            continue
        cfg = resolve(ModelConfig.from_dict(m))
        task, train = t.config.get("task") or {}, t.config.get("train") or {}
        prec = train.get("precision", "auto")
        dtype = "float32" if prec == "fp32" else "bfloat16"  # auto: bf16 autocast on CUDA
        tl_ = next((task[k] for k in ("train_len", "train_max_len", "context_len", "seq_len") if k in task), 128)
        if task.get("name") in ("word_problem",):
            tl_ += 1  # the model reads the word and its answer positions (a few tokens more): cover a partial chunk
        bs = train.get("batch_size", 32)
        if task.get("tokens_per_step"):
            bs = task["tokens_per_step"] // task.get("context_len", tl_)
        micro = task.get("micro_batch_size") or bs // max(1, train.get("grad_accum", 1))
        ev = [task[k] for k in ("test_len", "test_max_len") if k in task]
        ev += [task[s]["max_len"] for s in ("extrapolation",) if isinstance(task.get(s), dict) and "max_len" in task[s]]
        ev += [task[s]["seq_len"] for s in ("effective_rank",) if isinstance(task.get(s), dict) and "seq_len" in task[s]]
        yield cfg, dtype, micro, tl_, ev


def _recipe_shapes(path: Path, scale: str | None) -> list[dict]:
    """Kernel calls the trials of `recipe x scale` make: (dtype, n, K, V, H, B, T, gated, beta_max, bwd)."""
    shapes = []
    for cfg, dtype, micro, tl_, ev in _recipe_trials(path, scale):
        if cfg.family not in DELTA_FAMILIES:
            continue
        base = dict(dtype=dtype, n=cfg.num_householder, K=cfg.key_dim, V=cfg.value_dim, H=cfg.num_heads,
                    gate="rand" if cfg.use_forget_gate else "none", beta_max=2.0 if cfg.allow_neg_eigval else 1.0)
        base.update(h0=False, ht=True)  # the models start from a zero state and return the final one
        shape = dict(base, B=micro, T=tl_, bwd=True, evals=[])
        if ev:  # evaluation: a forward at the longest evaluated length, in the same process (same binaries)
            shape["evals"] = [[min(micro, 64), max(ev)]]
        shapes.append(shape)
    return shapes


def fused_recipe_cases() -> list[dict]:
    """The fused glue ops (gpu_check_fused.py) of every model shape the GPU scales of the shipped recipes build."""
    from dpx.orchestrator.load import read_recipe
    from gpu_check_fused import MODEL_KEYS
    out, seen = [], {}
    for path in sorted((ROOT / "recipes").glob("*.yaml")):
        for scale in [s for s in (read_recipe(path).get("scales") or {}) if s.startswith("gpu")]:
            try:
                trials = list(_recipe_trials(path, scale))
            except Exception:  # noqa: BLE001 - recipe_cases() reports a recipe that does not expand
                continue
            for cfg, dtype, micro, tl_, _ in trials:
                m = {k: getattr(cfg, k) for k in MODEL_KEYS}
                if cfg.family not in DELTA_FAMILIES:  # only the block norms run fused: one case per (dtype, d)
                    m = {k: (v if k in ("family", "hidden_size", "norm_eps") else None) for k, v in m.items()}
                    m["family"] = "other"
                c = fused_case(m, dtype, micro, tl_, f"{path.stem}:{scale}")
                key = c["id"].rsplit(" [", 1)[0]
                if key in seen:
                    seen[key]["sources"].append(c["source"])
                    continue
                c["sources"] = [c["source"]]
                seen[key] = c
                out.append(c)
    return out


def recipe_cases() -> tuple[list[dict], list[str]]:
    """Every kernel shape the GPU scales of the shipped recipes build (scales whose name starts with 'gpu')."""
    from dpx.orchestrator.load import read_recipe  # scales after `base:` composition (fig12 inherits fig5's)
    out, seen, notes = [], {}, []
    for path in sorted((ROOT / "recipes").glob("*.yaml")):
        scales = [s for s in (read_recipe(path).get("scales") or {}) if s.startswith("gpu")]
        for scale in scales:
            try:
                shapes = _recipe_shapes(path, scale)
            except Exception as e:  # noqa: BLE001 - a recipe that does not expand is reported, not fatal
                notes.append(f"{path.name} scale={scale}: could not expand: {e}")
                continue
            for s in shapes:
                s["evals"] = [_cap(s, *bt) for bt in s["evals"]]
                s["B"] = _cap(s, s["B"], s["T"])[0]
                key = json.dumps(s, sort_keys=True)
                if key in seen:  # one case per kernel shape; it lists every recipe scale that builds it
                    seen[key]["sources"].append(f"{path.stem}:{scale}")
                    continue
                c = case(source=f"{path.stem}:{scale}", fla=False, **s)
                c["sources"] = [c["source"]]
                seen[key] = c
                out.append(c)
    return out, notes


def _cap(s, B, T):
    """Cap the batch of one case (the float64 reference holds several [B, T*n, H, K] tensors and its
    [B, H, chunks, 64, 64] intra-chunk matrices; several cases share the GPU): the kernels' grids differ only in
    their batch dimension, and every offset is int64 where it can pass 2^31."""
    while B > 1 and B * T * s["n"] * s["H"] * max(s["K"], s["V"]) > 2 ** 27:
        B //= 2
    return [B, T]


# ------------------------------------------------------------------------------------------------ one case
def _inputs(c, dev):
    import torch
    gen = torch.Generator().manual_seed(zlib.crc32(c["id"].encode()))  # the same inputs in every rerun
    B, T, H, K, V, n = c["B"], c["T"], c["H"], c["K"], c["V"], c["n"]
    N = B if c["cu"] is None else len(c["cu"]) - 1
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)
    q, k, v = r(B, T, H, K), r(B, T * n, H, K), r(B, T * n, H, V)
    beta = torch.rand(B, T * n, H, generator=gen, dtype=torch.float64) * c["beta_max"]
    gate = c["gate"]
    if gate == "none":
        g = None
    elif gate == "zero":
        g = torch.zeros(B, T, H, dtype=torch.float64)
    elif gate == "neg":
        g = -20 - 40 * torch.rand(B, T, H, generator=gen, dtype=torch.float64)
    elif gate == "mixed":
        g = torch.where(torch.rand(B, T, H, generator=gen) < 0.5, 0.0, -30.0).double()
    else:  # the models' range: -exp(A_log) softplus(.) with A in [1, 16]
        g = -torch.rand(B, T, H, generator=gen, dtype=torch.float64) * 2
    h0 = r(N, H, K, V) if c["h0"] else None
    return [x if x is None else x.to(dev) for x in (q, k, v, beta, g, h0)]


def _rel(out, ref):
    import torch
    out, ref = out.detach().double(), ref.detach().double()
    if not torch.isfinite(out).all():
        return float("inf")
    # an RMS floor of 1e-3: outputs that are ~0 (dg and dh0 under gates of -20..-60, sums of O(1) terms that cancel
    # to ~1e-9) are compared in absolute terms, so float32 rounding of the cancelling terms is not a relative error
    floor = 1e-3 * math.sqrt(ref.numel())
    return float((out - ref).norm() / max(float(ref.norm()), floor))


def _run_chunk(c, fn, inputs, dtype, do, dht):
    """fn(q, k, v, g, beta, ...) in fla's order; returns the outputs and gradients named NAMES (None if absent)."""
    import torch
    q, k, v, beta, g, h0 = inputs
    lo = lambda x: x.detach().to(dtype).requires_grad_(c["bwd"])
    xs = [lo(q), lo(k), lo(v), lo(beta)]
    gg = None if g is None else g.detach().float().requires_grad_(c["bwd"])
    hh = None if h0 is None else h0.detach().float().requires_grad_(c["bwd"])
    cu = None if c["cu"] is None else torch.tensor(c["cu"], device=q.device)
    o, ht = fn(xs[0], xs[1], xs[2], gg, xs[3], c["n"], scale=c["K"] ** -0.5, initial_state=hh,
               output_final_state=c["ht"], use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    res = {"o": o, "ht": ht}
    if c["bwd"]:
        loss = (o * do.to(o.dtype)).float().sum()
        if c["ht"]:
            loss = loss + (ht * dht).sum()
        loss.backward()
        res.update(dq=xs[0].grad, dk=xs[1].grad, dv=xs[2].grad, dbeta=xs[3].grad,
                   dg=None if gg is None else gg.grad, dh0=None if hh is None else hh.grad)
    return res


def run_case(c) -> dict:
    import torch
    from dpx.kernels.delta_product.torch_chunk import torch_chunk_gated_delta_product
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # cpu: the interpreter (tests)
    dtype = getattr(torch, c["dtype"])
    inputs = _inputs(c, dev)
    # the reference sees the inputs as the kernel does: q, k, v, beta rounded to the case's dtype
    rounded = [x if x is None or i > 3 else x.to(dtype).double() for i, x in enumerate(inputs)]
    if c["kind"] == "fused":
        return run_fused_case(c, _rel)
    row = {"errors": {}, "fla_errors": {}}
    if c["kind"] == "decode":
        from dpx.kernels.delta_product.fused_recurrent import fused_recurrent_gated_delta_product as dec
        q, k, v, beta, g, h0 = inputs
        f = lambda x: None if x is None else x.to(dtype)
        t0 = time.time()
        o, S = dec(f(q), f(k), f(v), None if g is None else g.float(), f(beta), num_householder=c["n"],
                   scale=c["K"] ** -0.5, initial_state=None if h0 is None else h0.float(), output_final_state=True,
                   use_qk_l2norm_in_kernel=True)
        _sync()
        row["kernel_s"] = round(time.time() - t0, 2)
        q, k, v, beta, g, h0 = rounded
        o_r, S_r = torch_chunk_gated_delta_product(q, k, v, g, beta, num_householder=c["n"], scale=c["K"] ** -0.5,
                                                   initial_state=h0, output_final_state=True,
                                                   use_qk_l2norm_in_kernel=True)
        row["errors"] = {"o": _rel(o, o_r), "ht": _rel(S, S_r)}
        return row
    from dpx.kernels.delta_product.chunk import backward_path, chunk_gated_delta_product, dqkwg_kernel
    gen = torch.Generator().manual_seed(7)
    B, T, H, V = c["B"], c["T"], c["H"], c["V"]
    N = B if c["cu"] is None else len(c["cu"]) - 1
    do = torch.randn(B, T, H, V, generator=gen, dtype=torch.float64).to(dev).to(dtype)  # dO in the output dtype
    dht = torch.randn(N, H, c["K"], V, generator=gen, dtype=torch.float64).to(dev).float()
    row["backward_path"] = backward_path(dtype, c["n"], c["K"]) if c["bwd"] else None
    if row["backward_path"] in ("triton", "triton_fp32"):  # which per-chunk gradient kernel(s) ran
        row["dqkwg_kernel"] = dqkwg_kernel(torch.device(dev))
    t0 = time.time()
    out = _run_chunk(c, chunk_gated_delta_product, inputs, dtype, do, dht)
    _sync()
    row["kernel_s"] = round(time.time() - t0, 2)  # first call: includes compile and autotuning
    ref_fn = lambda q, k, v, g, b, n, **kw: torch_chunk_gated_delta_product(q, k, v, g, b, num_householder=n, **kw)
    t1 = time.time()
    ref = _run_chunk(c, ref_fn, rounded, torch.float64, do.double(), dht.double())
    _sync()
    row["phase_s"] = {"reference": round(time.time() - t1, 2)}  # where a case's time goes (with kernel_s, import)
    t1 = time.time()
    row["errors"] = {nm: _rel(out[nm], ref[nm]) for nm in NAMES if ref.get(nm) is not None}
    missing = [nm for nm in NAMES if (ref.get(nm) is None) != (out.get(nm) is None)]
    if missing:
        row["errors"].update({nm: float("inf") for nm in missing})
    if c["bwd"]:  # the same inputs with no gradient wanted: the forward that keeps no chunk states (at n_h > 1
        # chunk_super's walk, one state per super-chunk, and o_tok over it), against the same reference
        with torch.no_grad():
            ng = _run_chunk(dict(c, bwd=False), chunk_gated_delta_product, inputs, dtype, None, None)
        for nm in ("o", "ht"):
            if ref.get(nm) is not None:
                row["errors"][f"{nm}(no_grad)"] = _rel(ng[nm], ref[nm]) if ng.get(nm) is not None else float("inf")
    _sync()
    row["phase_s"]["no_grad"] = round(time.time() - t1, 2)  # its first call: chunk_super's and o_tok's autotuning
    t1 = time.time()
    if c["fla"] and c.get("with_fla"):
        try:
            from fla.ops.gated_delta_product import chunk_gated_delta_product as fla_fn
            fo = _run_chunk(c, fla_fn, inputs, dtype, do, dht)
            row["fla_errors"] = {nm: _rel(fo[nm], ref[nm]) for nm in NAMES if ref.get(nm) is not None
                                 and fo.get(nm) is not None}
        except Exception as e:  # noqa: BLE001 - fla is an anchor, never a requirement
            row["fla_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    for B2, T2 in c.get("evals") or []:  # forward only, at an evaluation length
        c2 = dict(c, B=B2, T=T2, bwd=False, id=f"{c['id']} eval {B2}x{T2}")
        inp2 = _inputs(c2, dev)
        rnd2 = [x if x is None or i > 3 else x.to(dtype).double() for i, x in enumerate(inp2)]
        with torch.no_grad():
            o2 = _run_chunk(c2, chunk_gated_delta_product, inp2, dtype, None, None)
            r2 = _run_chunk(c2, ref_fn, rnd2, torch.float64, None, None)
        for nm in ("o", "ht"):
            if r2.get(nm) is not None:
                row["errors"][f"{nm}@{T2}"] = _rel(o2[nm], r2[nm])
    row["phase_s"]["fla_evals"] = round(time.time() - t1, 2)
    return row


def _peak_gib():
    """The caching allocator's peak reservation in this process (GiB; the CUDA context comes on top), or None."""
    import torch
    return round(torch.cuda.max_memory_reserved() / 2 ** 30, 2) if torch.cuda.is_available() else None


def _sync():
    import torch
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _autotuners() -> dict:
    """Every autotuned kernel of the delta family: {kernel name: its triton Autotuner}."""
    from dpx.kernels.utils import autotuner
    from dpx.kernels.delta_product import (chunk_bwd, chunk_bwd_split, chunk_h, chunk_o, chunk_super, fused_recurrent,
                                           wy_fast)
    out = {}
    for mod in (wy_fast, chunk_h, chunk_o, chunk_super, chunk_bwd, chunk_bwd_split, fused_recurrent):
        for name in dir(mod):
            at = autotuner(getattr(mod, name))
            if at is not None:
                out[name] = at
    return out


def best_configs() -> dict:
    """The config each autotuned kernel chose in this process (the last key it tuned)."""
    return {name: str(list(at.cache.values())[-1]) for name, at in _autotuners().items() if getattr(at, "cache", None)}


def config_timings() -> dict:
    """What each config of each autotuned kernel took when this process's autotuner last timed it (median ms; None:
    the config failed to run), so that a pruning of an autotune space can be judged by what it would cost each case
    (benchmarks/autotune_wins.py --regret), not only by which config won."""
    out = {}
    for name, at in _autotuners().items():
        tm = getattr(at, "configs_timings", None)
        if not tm:
            continue
        med = {str(cfg): (t[0] if isinstance(t, (list, tuple)) else t) for cfg, t in tm.items()}
        out[name] = {cfg: (round(float(t), 6) if t is not None and math.isfinite(t) else None) for cfg, t in med.items()}
    return out


def judge(c, row) -> tuple[str, list[str]]:
    tol = TOL[c["dtype"]]
    bad = []
    for nm, e in row["errors"].items():
        t = tol * (4 if nm == "dg" else 1) * (2 if "@" in nm else 1)  # long evaluation forwards: 2x
        fe = row["fla_errors"].get(nm)
        if not e <= t:
            bad.append(f"{nm} {e:.1e}>{t:.0e}")
        elif fe is not None and c["dtype"] != "float32" and e > FLA_FACTOR * fe and e > t / 4:
            bad.append(f"{nm} {e:.1e}>{FLA_FACTOR:g}x fla {fe:.1e}")
    return ("pass" if not bad else "fail"), bad


def worker(spec: str) -> int:
    c = json.loads(spec)
    if not _has_cuda():
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: the CPU runs the kernels in numpy
    # dpx's autotuners are built (at import) without on-disk autotune results, so each case runs every config at
    # its own shape, as a user's first call does; fla's, built after, share results between the cases of this run
    # (fla is the error anchor, and its autotuning takes minutes)
    t0 = time.time()
    import dpx.kernels.delta_product.chunk, dpx.kernels.delta_product.fused_recurrent  # noqa: E401,F401
    import_s = time.time() - t0
    os.environ["TRITON_CACHE_AUTOTUNING"] = "1"
    try:
        row = run_case(c)
        row.setdefault("phase_s", {})["import"] = round(import_s, 2)
        row["process"] = os.environ.get("DPX_CHECK_PROCESS", "fresh")  # zygote: forked with the imports done
        row["gpu_peak_gib"] = _peak_gib()
        try:
            row["configs"] = best_configs()
            row["config_ms"] = config_timings()
        except Exception:  # noqa: BLE001
            pass
        print("RESULT " + json.dumps(row), flush=True)
        return 0
    except Exception as e:  # noqa: BLE001
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        print("ERROR " + json.dumps({"error": f"{type(e).__name__}: {msg[:400]}"}), flush=True)
        return 3


# ------------------------------------------------------------------------------------------------ the driver
def _has_cuda() -> bool:
    import torch
    return torch.cuda.is_available()


# The zygote: a multiprocessing forkserver that imported torch, triton and dpx's kernels once; a case's first
# process is forked from it instead of starting an interpreter and importing them again. Still one process per case
# (a fault kills only that child). Why: session 27's 193 cases spent ~2,900 of 13,146 case-seconds starting Python
# and importing, ~20 % of a check that the CPU bounds. Nothing in those imports touches CUDA (a CUDA driver
# initialized before a fork breaks the child), so the children pick their GPU (CUDA_VISIBLE_DEVICES) as a fresh
# process does. The reruns that locate a fault (DPX_KERNEL_SYNC, DPX_AUTOTUNE_PIN and CUDA_LAUNCH_BLOCKING, read at
# import) start fresh processes, as does every case under --no-zygote.
ZYGOTE_PRELOAD = ("torch", "triton", "dpx.kernels.delta_product.chunk", "dpx.kernels.delta_product.fused_recurrent",
                  "dpx.kernels.fused")
_ZYGOTE: dict = {"on": False, "ctx": None, "env": {}}
# read when the kernels are imported (kernels/utils): a child whose switches differ from the zygote's needs a fresh
# process; every other variable is read at call time, and a child gets the driver's whole environment
_IMPORT_TIME = ("TRITON_INTERPRET", "DPX_NO_AUTOTUNE", "DPX_KERNEL_SYNC", "DPX_AUTOTUNE_PIN", "CUDA_LAUNCH_BLOCKING")


def _import_env(env) -> dict:
    return {k: env.get(k) for k in _IMPORT_TIME}


def start_zygote() -> None:
    """Start the forkserver with its imports (before the driver's threads: it inherits this process's environment,
    TRITON_INTERPRET included where there is no GPU)."""
    import multiprocessing as mp
    from multiprocessing import forkserver
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(ZYGOTE_PRELOAD))
    forkserver.ensure_running()  # a forkserver started before (tests run the driver in-process) is kept: its
    _ZYGOTE.update(on=True, ctx=ctx, env=_ZYGOTE["env"] or _import_env(os.environ))  # switches as they were then


def _zygote_child(spec: str, env: dict, out_path: str, err_path: str) -> None:
    """A case's process, forked from the zygote, in the driver's environment: its stdout and stderr go to files the
    driver reads."""
    for fd, path in ((1, out_path), (2, err_path)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(f, fd)
        os.close(f)
    os.environ.clear()
    os.environ.update(env)
    os.environ["DPX_CHECK_PROCESS"] = "zygote"
    try:
        rc = worker(spec)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    sys.exit(rc)


def _run_forked(c, env_extra: dict, timeout: float):
    """(stdout, stderr, exit status) of one case forked from the zygote; -9 and a timeout line when it outlasts
    `timeout` (killed, as subprocess.run's timeout kills)."""
    import tempfile
    fo, out_path = tempfile.mkstemp(prefix="gpu_check_", suffix=".out")
    fe, err_path = tempfile.mkstemp(prefix="gpu_check_", suffix=".err")
    os.close(fo)
    os.close(fe)
    try:
        env = dict(os.environ, **env_extra)
        p = _ZYGOTE["ctx"].Process(target=_zygote_child, args=(json.dumps(c), env, out_path, err_path))
        p.start()
        p.join(timeout)
        timed_out = p.exitcode is None
        if timed_out:
            p.kill()
            p.join()
        rc = -9 if timed_out else p.exitcode
        p.close()
        out, err = Path(out_path).read_text(errors="replace"), Path(err_path).read_text(errors="replace")
        return out, (f"timeout after {timeout} s" if timed_out else err), rc
    finally:
        for f in (out_path, err_path):
            with contextlib.suppress(OSError):
                os.unlink(f)


def _spawn(c, env_extra=None, timeout=200):
    """Run one case in its own process (the worker below): forked from the zygote when it runs and the case needs
    no import-time switch, else a fresh interpreter. Its RESULT/ERROR line, exit status and wall time."""
    env_extra = dict(env_extra or {})
    t0 = time.time()
    forked = _ZYGOTE["on"] and _import_env(dict(os.environ, **env_extra)) == _ZYGOTE["env"]
    if forked:
        why = None
        try:
            out, err, rc = _run_forked(c, env_extra, timeout)
            if rc != 0 and re.search(r"re-initialize CUDA|CUDA driver initialization|cudaErrorInitializationError|"
                                     r"initialization error", out + err):  # a CUDA that the zygote's fork broke
                why = (out + err).strip().splitlines()[-1][:200]
        except (OSError, EOFError, ValueError) as e:  # the forkserver itself is gone
            why = f"{type(e).__name__}: {e}"
        if why is not None:  # never again in this run: this case and the rest start afresh
            with _LOCK:
                if _ZYGOTE["on"]:
                    print(f"gpu_check: the zygote failed ({why}); every case runs afresh from here (--no-zygote)",
                          flush=True)
                _ZYGOTE["on"] = False
            forked = False
    if not forked:
        env = dict(os.environ, PYTHONUNBUFFERED="1", **env_extra)
        try:
            p = subprocess.run([sys.executable, __file__, "--case", json.dumps(c)], capture_output=True, text=True,
                               env=env, timeout=timeout)
            out, err, rc = p.stdout, p.stderr, p.returncode
        except subprocess.TimeoutExpired as e:
            out, err, rc = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), "", -9
            err = f"timeout after {timeout} s"
    res = {"rc": rc, "wall_s": round(time.time() - t0, 1)}
    for line in out.splitlines():
        if line.startswith("RESULT "):
            res["row"] = json.loads(line[7:])
        elif line.startswith("ERROR "):
            res["error"] = json.loads(line[6:])["error"]
    if "row" not in res and "error" not in res:
        tail = [ln for ln in (err or "").splitlines() if ln.strip()][-3:]
        res["error"] = " | ".join(tail)[-400:] or f"exit {rc}"
    fault = [ln for ln in (err + out).splitlines() if "DPX_KERNEL_FAULT" in ln]
    if fault:
        res["fault_kernel"] = fault[0].split("DPX_KERNEL_FAULT", 1)[1].strip().split()[0]
    return res


def _n_configs(kernel: str) -> int:
    at = _autotuners().get(kernel)
    return 0 if at is None else len(at.configs)


_LOCK = threading.Lock()
_BISECTED: set = set()


_GPUS: list = []  # --gpus: the cases go round these (CUDA_VISIBLE_DEVICES per case); empty: the default device
_NEXT_GPU = [0]


def _pick_gpu() -> dict:
    """The next GPU of --gpus for one case (all its reruns stay on it), as the env its processes get."""
    if not _GPUS:
        return {}
    with _LOCK:
        g = _GPUS[_NEXT_GPU[0] % len(_GPUS)]
        _NEXT_GPU[0] += 1
    return {"CUDA_VISIBLE_DEVICES": g}


def check_one(c, timeout=200, gpu=None) -> dict:
    """One case in its own process, and where it dies, the reruns that locate the fault. gpu: the GPU id of
    --gpus it runs on (the schedule's pick); None: the next of --gpus in turn."""
    gpu = _pick_gpu() if gpu is None else {"CUDA_VISIBLE_DEVICES": gpu}
    spawn = lambda c_, extra=None, **kw: _spawn(c_, {**gpu, **(extra or {})}, **kw)  # noqa: E731
    res = spawn(c, timeout=timeout)
    row = dict(c, wall_s=res["wall_s"])
    if gpu:
        row["gpu"] = gpu["CUDA_VISIBLE_DEVICES"]
    if "row" in res:
        row.update(res["row"])
        row["status"], row["bad"] = judge(c, res["row"])
        return row
    err = res["error"]
    row["status"], row["error"] = ("timeout" if res["rc"] == -9 else "oom" if "out of memory" in err.lower() else
                                   "fault" if "illegal" in err.lower() or "cuda error" in err.lower() else "error"), err
    if row["status"] in ("timeout", "oom"):  # oom: the driver runs it again alone at the end
        return row
    # locate: blocking launches name the kernel; then each of its autotune configs alone
    loc = spawn(c, {"CUDA_LAUNCH_BLOCKING": "1", "DPX_KERNEL_SYNC": "1"})
    row["fault_kernel"] = loc.get("fault_kernel")
    row["blocking_rerun"] = "pass" if "row" in loc else loc.get("error", "")[:300]
    if "row" in loc:  # gone under blocking launches: is it reproducible at all, as the user's run had it?
        again = spawn(c)
        row["plain_rerun"] = "pass" if "row" in again else again.get("error", "")[:300]
    k = row["fault_kernel"]
    with _LOCK:
        first = k is not None and k not in _BISECTED
        _BISECTED.add(k)
    if first:  # once per kernel: each config alone, on this case
        row["configs_faulting"] = []
        for i in range(_n_configs(k)):
            pr = spawn(c, {"DPX_AUTOTUNE_PIN": f"{k}:{i}", "DPX_KERNEL_SYNC": "1"})
            if "row" not in pr:
                row["configs_faulting"].append(i)
    return row


def known_walls() -> dict:
    """{case id: s} the largest wall_s a committed check row recorded for a case that passed: the schedule's
    order, longest first, so that the run's tail is short (longest-processing-time first)."""
    walls: dict = {}
    for f in sorted((ROOT / "benchmarks" / "results").glob("gpu_check*_rows.jsonl")):
        for ln in f.read_text().splitlines():
            r = json.loads(ln) if ln.strip() else {}
            if r.get("status") == "pass" and r.get("wall_s"):
                walls[r["id"]] = max(walls.get(r["id"], 0.0), float(r["wall_s"]))
    return walls


def in_schedule_order(cases: list, walls: dict) -> list:
    """The slowest cases first, so that the run's tail is short and a capped run has seen the hard shapes: cases no
    committed row has timed (new shapes) first, by the old rule (long sequences and recipe evaluation lengths, then
    the shapes that faulted before: issue 14's 16-bit head dim 32, n_h = 3, head dim 85), then the timed ones by
    their wall time, longest first."""
    return sorted(cases, key=lambda c: (c["id"] in walls, -walls.get(c["id"], 0.0), 0 if c["T"] >= 8192 or c["evals"]
                                        else 1 if c["K"] in (32, 85) or c["n"] == 3 else 2))


MEM_USE = 0.9  # of each GPU's memory, for the cases' estimates (gpu_check_schedule.est_gib) together


def known_peaks() -> dict:
    """{case id: GiB} the largest peak GPU memory any committed check row recorded (gpu_peak_gib, since session
    27): the schedule's memory estimates for the cases seen before."""
    peaks: dict = {}
    for f in sorted((ROOT / "benchmarks" / "results").glob("gpu_check*_rows.jsonl")):
        for ln in f.read_text().splitlines():
            r = json.loads(ln) if ln.strip() else {}
            if r.get("gpu_peak_gib") is not None:
                peaks[r["id"]] = max(peaks.get(r["id"], 0.0), r["gpu_peak_gib"])
    return peaks


def gpu_memory_gib(gpus: list[str]) -> dict | None:
    """{gpu id: GiB the cases may use} from nvidia-smi (not torch, so this process holds no CUDA context); None
    where it cannot be asked (no memory limit then: --jobs alone bounds the pool)."""
    ids = gpus or ["0"]
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i",
                            ",".join(ids)], capture_output=True, text=True, timeout=30, check=True).stdout.split()
        gib = [float(m) / 1024 * MEM_USE for m in q]
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    if len(gib) != len(ids):
        return None
    return {(g if gpus else None): round(m, 1) for g, m in zip(ids, gib)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=".")
    ap.add_argument("--jobs", type=int, default=6)
    ap.add_argument("--gpus", default="", help="comma-separated GPU ids the cases go round (one per case, set as its "
                    "CUDA_VISIBLE_DEVICES; --jobs counts all of them together); default: the one default device")
    ap.add_argument("--only", default="", help="run the cases whose id contains this (A|B: either)")
    ap.add_argument("--no-recipes", action="store_true")
    ap.add_argument("--no-fla", action="store_true", help="skip phase 2 (fla's error beside ours on 16-bit rows)")
    ap.add_argument("--fla-jobs", type=int, default=4, help="parallel cases in phase 2")
    ap.add_argument("--fla-timeout-s", type=float, default=420, help="limit of one phase-2 case (fla autotunes)")
    ap.add_argument("--case-timeout-s", type=float, default=330,
                    help="limit of one phase-1 case (its first-call autotuning included: the fp32 head-dim-85 "
                    "cases compile every config of every kernel: 150-200 s at 16 jobs, session 17)")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="set NAME=VALUE in every case's process (repeatable; recorded in the summary and each row), "
                    "e.g. DPX_KERNEL_DQKWG=split")
    ap.add_argument("--no-zygote", action="store_true",
                    help="start every case's process afresh (default: fork first runs from a process that imported "
                    "torch, triton and the kernels once)")
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    ap.add_argument("--kernels-sha", action="store_true", help="print the kernels' source digest and exit")
    ap.add_argument("--budget-s", type=float, default=0, help="start no case after this many seconds (0: no limit)")
    ap.add_argument("--name", default="gpu_check", help="output file stem")
    ap.add_argument("--rerun", default="", help="with --resume: run these cases again (id substrings, A|B)")
    ap.add_argument("--keep-other-kernels", action="store_true",
                    help="with --resume: keep rows run on other kernel code (each row keeps its kernels_sha; the "
                    "summary counts rows per sha): for a fix that provably leaves those rows' launches unchanged")
    ap.add_argument("--resume", default="", help="an earlier run's JSON or _rows.jsonl: its finished rows are kept "
                    "(not rerun) and only its not-run cases run, so a check may span several device calls")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    if a.case:
        sys.exit(worker(a.case))
    if a.kernels_sha:
        print(kernels_sha())
        return
    try:
        env = parse_env(a.env)
    except ValueError as e:
        ap.error(str(e))
    os.environ.update(env)  # every case's process (and its reruns) inherits them
    _GPUS[:] = [g.strip() for g in a.gpus.split(",") if g.strip()]
    os.environ.pop("TRITON_CACHE_AUTOTUNING", None)  # every case autotunes dpx's kernels afresh, as a user's run
    cases, notes = matrix_cases(), []
    if not a.no_recipes:
        rc_, notes = recipe_cases()
        cases += rc_ + fused_recipe_cases()
    if a.only:
        cases = [c for c in cases if any(o in c["id"] for o in a.only.split("|"))]
    if a.list:
        for c in cases:
            print(c["id"])
        print(f"{len(cases)} cases", *notes, sep="\n")
        return
    cases = in_schedule_order(cases, known_walls())
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()

    def over() -> bool:
        return bool(a.budget_s) and time.time() - t0 > a.budget_s

    def one(c, gpu=None, alone=False):
        if over() and not alone:
            return dict(c, status="not_run", error=f"budget of {a.budget_s:g} s spent")
        row = check_one(c, timeout=a.case_timeout_s, gpu=gpu)
        row["mem_est_gib"] = est_gib(c, peaks)
        return row
    cases_by_id, peaks = {c["id"]: c for c in cases}, known_peaks()

    def anchor(row):  # phase 2: the same case again with fla beside it, judged against fla's error too
        if over():
            return dict(row, fla_error="not run: budget spent")
        again = check_one(dict(row, with_fla=True), timeout=a.fla_timeout_s)
        if again["status"] not in ("pass", "fail"):  # fla's own trouble (its autotuning outlasting the limit)
            return dict(row, fla_error=f"{again['status']}: {again.get('error', '')[:200]}")
        return dict(again, with_fla=False)

    rows = []
    stream = open(out / f"{a.name}_rows.jsonl", "w")  # one line per finished case: a killed run keeps its rows
    sha = kernels_sha()
    kept = load_finished(a.resume) if a.resume else {}
    if a.rerun:
        kept = {i: r for i, r in kept.items() if not any(o in i for o in a.rerun.split("|"))}
    stale = sorted({str(r.get("kernels_sha")) for r in kept.values()} - {sha})
    if stale and not a.keep_other_kernels:
        sys.exit(f"{a.resume}: rows of other kernel code ({', '.join(stale)}; this tree is {sha}): a resumed check "
                 "runs the same kernels, or says with --keep-other-kernels that those rows' launches are unchanged")
    other_env = sorted({_env_key(r.get("env")) for r in kept.values()} - {_env_key(env)})
    if other_env and not a.keep_other_kernels:
        sys.exit(f"{a.resume}: rows run with other --env ({'; '.join(other_env)}; this run: {_env_key(env)}): "
                 "a resumed check runs the same kernel switches, or says so with --keep-other-kernels")
    ids = {c["id"] for c in cases}
    rows += [r for i, r in kept.items() if i in ids]
    for r in rows:
        stream.write(json.dumps(r, default=str) + "\n")
    if kept:
        print(f"resumed {len(rows)} finished rows from {a.resume}; {len(cases) - len(rows)} cases to run", flush=True)

    def report(row, n, phase=""):
        row["kernels_sha"] = sha
        row["env"] = env
        rows.append(row) if not phase else None
        stream.write(json.dumps(row, default=str) + "\n")
        stream.flush()
        bad = "; ".join(row.get("bad") or []) or row.get("error", "") or row.get("fla_error", "")
        print(f"[{phase}{len(rows)}/{n} {time.time() - t0:5.0f}s] {row['status']:7} {row['id']}"
              f"{'  ' + bad if bad else ''}"
              f"{'  kernel=' + str(row.get('fault_kernel')) if row.get('fault_kernel') else ''}"
              f"{'  blocking rerun: ' + str(row.get('blocking_rerun'))[:80] if 'blocking_rerun' in row else ''}",
              flush=True)

    # phase 1, every case, dpx alone (fla's first-call autotuning, minutes and many kernels, must not hold the
    # pool): one case of each compile group first, the cases packed by their memory estimates (gpu_check_schedule)
    if not a.no_zygote:
        if not _has_cuda():  # the zygote imports triton: the interpreter must be chosen before, as worker() does
            os.environ["TRITON_INTERPRET"] = "1"
        start_zygote()
    mem = gpu_memory_gib(_GPUS)
    if mem:
        print(f"GPU memory for the cases: {mem} GiB; {a.jobs} jobs at most", flush=True)
    for row in schedule([c for c in cases if c["id"] not in kept], a.jobs, one, mem,
                        est=lambda c: est_gib(c, peaks)):
        report(row, len(cases))
    # a case that ran out of GPU memory beside others (an estimate too low) runs again alone, once
    ooms = [r for r in rows if r["status"] == "oom"]
    for r in ooms:
        rows.remove(r)
        again = one(cases_by_id[r["id"]], next(iter(mem)) if mem else None, alone=True)
        again["oom_rerun"] = r.get("error", "")[:200]
        report(again, len(cases))
    # phase 2, the fla anchor (16-bit rows fla runs), on a small pool with a longer limit, if the budget allows
    if not a.no_fla:
        todo = [r for r in rows if r["fla"] and r["status"] == "pass" and not r.get("fla_errors")
                and not str(r.get("fla_error", "")).startswith(("ImportError", "ModuleNotFound"))]
        done = {}
        # fla autotunes per (dtype, head dims) and keeps the results on disk for this run (TRITON_CACHE_AUTOTUNING):
        # one case of each such group first, the rest of a group after it, so they read the cache instead of all
        # autotuning the same kernels at once (session 6: five workers autotuning together outlasted a 240-s limit)
        for r in schedule(todo, a.fla_jobs, lambda r, _gpu: anchor(r), group=lambda r: (r["dtype"], r["K"], r["V"])):
            done[r["id"]] = r
            report(r, len(todo), phase="fla ")
        rows[:] = [done.get(r["id"], r) for r in rows]
    order = {c["id"]: i for i, c in enumerate(cases)}
    rows.sort(key=lambda r: order[r["id"]])
    import torch, triton
    summary = {"cases": len(rows), "pass": sum(r["status"] == "pass" for r in rows),
               "fail": sum(r["status"] == "fail" for r in rows), "fault": sum(r["status"] == "fault" for r in rows),
               "error": sum(r["status"] == "error" for r in rows),
               "not_run": sum(r["status"] == "not_run" for r in rows),
               "timeout": sum(r["status"] == "timeout" for r in rows),
               "oom": sum(r["status"] == "oom" for r in rows), "wall_s": round(time.time() - t0, 1),
               "jobs": a.jobs, "gpu_memory_gib": mem,
               # the rows whose allocator peak passes est_gib's shape formula less the context: the formula (what
               # a case never measured gets) is low there
               "mem_estimate_low": [r["id"] for r in rows if r.get("gpu_peak_gib") is not None and r.get(
                   "kind") in ("chunk", "fused", "decode") and r["gpu_peak_gib"] > est_gib(r) - CTX_GIB],
               "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
               "torch": torch.__version__, "triton": triton.__version__, "tolerances": TOL, "fla_factor": FLA_FACTOR,
               "commit": _git("rev-parse", "--short", "HEAD"), "dirty": bool(_git("status", "--porcelain")),
               # the device tool's copy of the tree can carry a stale .git: the kernels' own source digest names
               # the code that ran (compare with `python3 benchmarks/gpu_check.py --kernels-sha` here)
               "kernels_sha": sha,
               "rows_by_kernels_sha": _count(rows, lambda r: str(r.get("kernels_sha"))),
               "env": env, "rows_by_env": _count(rows, lambda r: _env_key(r.get("env"))), "gpus": _GPUS,
               "rows_by_process": _count(rows, lambda r: r.get("process", "-")),  # zygote / fresh (see _spawn)
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "notes": notes,
               "command": " ".join(["python3", "benchmarks/gpu_check.py"] + sys.argv[1:])}
    (out / f"{a.name}.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1, default=str))
    (out / f"{a.name}.md").write_text(markdown(summary, rows))
    print(json.dumps(summary))
    sys.exit(0 if summary["pass"] == len(rows) else 1)


def parse_env(items) -> dict:
    """--env NAME=VALUE items -> {NAME: VALUE} (a later NAME wins); a malformed item raises ValueError."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not name.replace("_", "a").isalnum() or name[0].isdigit():
            raise ValueError(f"--env: expected NAME=VALUE, got {item!r}")
        out[name] = value
    return out


def _count(rows, key) -> dict:
    """{key(row): how many rows} in key order (rows per kernels_sha, per --env)."""
    keys = [key(r) for r in rows]
    return {k: keys.count(k) for k in sorted(set(keys))}


def _env_key(env) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted((env or {}).items())) or "(none)"


def load_finished(path) -> dict:
    """{case id: row} of an earlier run's finished rows (every status but not_run and oom); the last line of an id
    wins."""
    text = Path(path).read_text()
    rows = json.loads(text)["rows"] if text.lstrip().startswith("{\"summary\"") or path.endswith(".json") else \
        [json.loads(ln) for ln in text.splitlines() if ln.strip()]
    return {r["id"]: r for r in rows if r.get("status") not in (None, "not_run", "oom")}


def kernels_sha() -> str:
    """sha256 (16 hex) of every kernels/**/*.py, path and content: which kernel code a result belongs to."""
    import hashlib
    h = hashlib.sha256()
    for f in sorted((ROOT / "kernels").rglob("*.py")):
        h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def _git(*args) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except Exception:  # noqa: BLE001
        return ""


def markdown(summary, rows) -> str:
    lines = [f"GPU acceptance check: {summary['pass']}/{summary['cases']} pass, {summary['fail']} fail, "
             f"{summary['fault']} fault, {summary['error']} error, {summary['timeout']} timeout, "
             f"{summary['not_run']} not run; {summary['device']}, torch {summary['torch']}, "
             f"Triton {summary['triton']}, commit {summary['commit']}, {summary['date']}, {summary['wall_s']} s; "
             f"kernels_sha {summary.get('kernels_sha')}"
             + ("" if len(summary.get("rows_by_kernels_sha") or {}) < 2 else
                " (rows per kernels_sha: " + ", ".join(f"{k} {v}" for k, v in summary["rows_by_kernels_sha"].items())
                + "; a resumed check: see each row's kernels_sha in the JSON)")
             + (f"; --env {_env_key(summary['env'])}" if summary.get("env") else ""), "",
             "| case | status | worst output (rel. err) | fla worst | backward | detail |", "|---|---|---|---|---|---|"]
    for r in rows:
        errs = r.get("errors") or {}
        worst = max(errs.items(), key=lambda kv: kv[1] / (4 if kv[0] == "dg" else 1), default=None)
        fl = r.get("fla_errors") or {}
        fw = max(fl.items(), key=lambda kv: kv[1], default=None)
        detail = "; ".join(r.get("bad") or []) or r.get("error", "") or r.get("fla_error", "")
        if r.get("fault_kernel"):
            detail += f" kernel={r['fault_kernel']} faulting configs={r.get('configs_faulting')}"
        lines.append(f"| {r['id']} | {r['status']} | {'' if not worst else f'{worst[0]} {worst[1]:.1e}'} | "
                     f"{'' if not fw else f'{fw[0]} {fw[1]:.1e}'} | {r.get('backward_path') or ''} | {detail[:160]} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
