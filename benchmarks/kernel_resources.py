"""What every DeltaProduct kernel launch costs a Hopper SM, found without a GPU: shared memory, registers, spills.

The launch paths of `chunk_gated_delta_product` (forward and backward) and of the decode kernel run on the CPU
with Triton's autotuner intercepted, so each kernel launch is recorded (arguments, constexprs, the autotune
configs that would be tried) instead of executed; every recorded (kernel, config) is then compiled ahead of time
for sm_90 with Triton's own compiler and `ptxas -v` (each distinct (kernel, config) once, `--jobs` at a time in
spawned processes; the registers and spills are read from Triton's own ptxas log, so ptxas runs once a build). A config whose shared memory is over the per-block limit
(232,448 B on H100/H200) cannot launch: the autotuner skips it, and where it is the only config (DPX_NO_AUTOTUNE=1,
or the only one left after pruning) the call fails with OutOfResources on the GPU. Spills (local-memory traffic)
are what the register-heavy kernels pay in speed.

    python benchmarks/kernel_resources.py                       # bf16 and fp32, d 64/128/256, n_h 1/2/3/4/8
    python benchmarks/kernel_resources.py --dtypes bf16 --dims 128 --ns 2 --out table.md
    python benchmarks/kernel_resources.py --dtypes bf16 --dims 64,128 --ns 2,3 --dqkwg both --kernels dqkw,kernel_wy
                                                                # the fused per-chunk gradient kernel beside the split

Each build gets the specialization a real launch gets from Triton's JIT (`aligned`: 16-byte aligned pointers and
multiples of 16 marked divisible by 16): without it (this script before session 14) nothing is vectorized and no
loop is software-pipelined, so the shared memory, registers and spills were not those of the binaries the GPU runs
(the state walk at bf16 d 128: 41 KB and 255 registers with spills unaligned, 82-147 KB pipelined, 104-204 registers
and no spill aligned). Numbers come from the local Triton (3.7.1 here); the GPU image runs Triton 3.6, whose
allocation can differ a little.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("kernel_resources: unset TRITON_INTERPRET (the kernels are compiled for sm_90, not interpreted)")

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource
from triton.runtime.autotuner import Autotuner
from triton.runtime.jit import JITFunction

HOPPER_SHARED_LIMIT = 232_448  # bytes per block (opt-in maximum on sm_90)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
TT = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int64: "i64",
      torch.int32: "i32", torch.bool: "i1"}


def _jit(k) -> JITFunction:
    while not isinstance(k, JITFunction):
        k = k.fn
    return k


def capture(fn) -> list[tuple[JITFunction, dict, list]]:
    """Run fn() with every autotuned Triton launch recorded instead of executed:
    [(jit function, {arg name: value} incl. constexprs and heuristics, [configs after pruning])]."""
    seen = []
    orig = Autotuner.run

    def run(self, *args, **kwargs):
        kwargs = {k: v for k, v in kwargs.items() if k not in ("grid", "warmup")}
        self.nargs = dict(zip(self.arg_names, args))
        configs = self.prune_configs(kwargs) if len(self.configs) > 1 else self.configs
        seen.append((_jit(self), {**self.nargs, **kwargs}, list(configs)))
        self.nargs = None

    Autotuner.run = run
    try:
        fn()
    finally:
        Autotuner.run = orig
    return seen


def signature(jf: JITFunction, values: dict, config) -> tuple[dict, dict]:
    allv = {**values, **config.kwargs}
    sig, consts = {}, {}
    for p in jf.params:
        v = allv[p.name]
        if p.is_constexpr or v is None:
            sig[p.name] = "constexpr"
            consts[p.name] = v
        elif isinstance(v, torch.Tensor):
            sig[p.name] = "*" + TT[v.dtype]
        elif isinstance(v, bool):
            sig[p.name] = "i1"
        elif isinstance(v, int):
            sig[p.name] = "i64" if abs(v) >= 2 ** 31 else "i32"
        elif isinstance(v, float):
            sig[p.name] = "fp32"
        else:
            raise TypeError(f"{jf.__name__}.{p.name}: cannot type {type(v).__name__}")
    return sig, consts


def aligned(jf: JITFunction, values: dict, config) -> tuple:
    """The parameters a real launch specializes as divisible by 16 (Triton's JIT: a tensor whose data pointer is
    16-byte aligned, an int that is a multiple of 16; not the do_not_specialize ones). Without these hints a compile
    vectorizes no load and software-pipelines no loop (no cp.async): its shared memory, registers and spills are not
    the binary the GPU runs (found in session 14: the state walk showed no async copies at any num_stages)."""
    allv = {**values, **config.kwargs}
    out = []
    for i, p in enumerate(jf.params):
        v = allv[p.name]
        if p.is_constexpr or v is None or getattr(p, "do_not_specialize", False) or isinstance(v, bool):
            continue
        if (isinstance(v, torch.Tensor) and v.data_ptr() % 16 == 0) or (isinstance(v, int) and v % 16 == 0):
            out.append(i)
    return tuple(out)


def fits(r: dict) -> bool:
    """A compiled config can launch on sm_90: it compiled and its shared memory is within the per-block limit."""
    return "error" not in r and r["shared"] <= HOPPER_SHARED_LIMIT


PTXAS_FLAGS = ["-lineinfo", "-v", "--regAllocOptLevel=2"]  # what Triton's make_cubin passes (its numbers, not others)


def _ptxas_numbers(text: str, ok: bool) -> dict:
    num = lambda pat: int(m.group(1)) if (m := re.search(pat, text)) else 0
    return {"regs": num(r"Used (\d+) registers"), "spill_st": num(r"(\d+) bytes spill stores"),
            "spill_ld": num(r"(\d+) bytes spill loads"), "ok": ok}


def ptxas_report(ptx: str, cc: int, arch: str) -> dict:
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "k.ptx"
        f.write_text(ptx)
        r = subprocess.run([get_ptxas(cc).path, *PTXAS_FLAGS, f"--gpu-name={arch}", str(f), "-o",
                            str(Path(d) / "k.cubin")], capture_output=True, text=True)
    return _ptxas_numbers(r.stderr, r.returncode == 0)


def compile_one(jf: JITFunction, values: dict, config, cc: int, sig_consts: tuple | None = None) -> dict:
    sig, consts = sig_consts or signature(jf, values, config)
    return _compile(jf, sig, consts, config.num_warps, config.num_stages, cc, aligned(jf, values, config))


def _compile(jf: JITFunction, sig: dict, consts: dict, warps: int, stages: int, cc: int, div16: tuple = ()) -> dict:
    """Compile one (kernel, config) for sm_cc. Triton runs ptxas -v itself and, with its ptxas log dumped, prints
    the registers and spills: those are read from its output, so ptxas runs once. On a hit in Triton's on-disk
    cache nothing is built and ptxas runs here on the cached PTX, with Triton's flags."""
    triton.knobs.nvidia.dump_ptxas_log = True
    out = io.StringIO()
    t0 = time.time()
    with contextlib.redirect_stdout(out):
        c = triton.compile(ASTSource(fn=jf, signature=sig, constexprs=consts,
                                     attrs={(i,): [["tt.divisibility", 16]] for i in div16}),
                           target=GPUTarget("cuda", cc, 32), options={"num_warps": warps, "num_stages": stages})
    compile_s = time.time() - t0
    log = out.getvalue()
    arch = f"sm_{cc}a" if cc == 90 else f"sm_{cc}"
    nums = _ptxas_numbers(log, True) if "Used " in log else ptxas_report(c.asm["ptx"], cc, arch)
    # CTA-wide barriers and warp shuffles in the PTX: what cross-warp reductions and layout conversions cost a
    # kernel that runs one CTA an SM (the per-chunk gradient kernel: 84 barriers non-gated, 123 gated, session 26)
    ptx = c.asm["ptx"]
    # compile_s: this build's seconds (a hit in Triton's cache is ~0): what a first call, and the GPU check, pay
    return {"shared": c.metadata.shared, **nums, "barriers": ptx.count("bar.sync"), "shuffles": ptx.count("shfl.sync"),
            "compile_s": round(compile_s, 2)}


def _compile_job(job: tuple) -> dict:
    """A worker's compile (spawned process): the kernel found again by module and name, as the launch recorded it."""
    module, name, sig, consts, warps, stages, cc, div16 = job
    try:
        return _compile(_jit(getattr(importlib.import_module(module), name)), sig, consts, warps, stages, cc, div16)
    except Exception as e:  # a compile error is a finding too
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"}


def launches(dtype: torch.dtype, d: int, n: int, gated: bool, bwd_fp32: str, dqkwg: str | None = None) -> list:
    """Every Triton kernel launch of one forward + backward of the chunk kernel, one no-grad forward, and one decode
    step (a backward
    that `backward_path` sends to PyTorch launches none). dqkwg: DPX_KERNEL_DQKWG for the backward (None: as set)."""
    from dpx.kernels import chunk_gated_delta_product, fused_recurrent_gated_delta_product

    B, T, H = 1, 64, 2
    g = torch.Generator().manual_seed(0)
    mk = lambda *s: torch.randn(*s, generator=g).to(dtype)
    q, k, v = mk(B, T, H, d), mk(B, T * n, H, d), mk(B, T * n, H, d)
    beta = torch.rand(B, T * n, H, generator=g).to(dtype)
    gate = -torch.rand(B, T, H, generator=g) if gated else None
    h0 = torch.zeros(B, H, d, d)

    def step():
        xs = [x.clone().requires_grad_() for x in (q, k, v, beta)]
        o, ht = chunk_gated_delta_product(xs[0], xs[1], xs[2], gate, xs[3], n, initial_state=h0,
                                          output_final_state=True)
        (o.float().sum() + ht.sum()).backward()
        with torch.no_grad():  # a forward that keeps no chunk states (n_h > 1: chunk_super's walk + o_tok), and decode
            chunk_gated_delta_product(q, k, v, gate, beta, n, initial_state=h0, output_final_state=True)
            fused_recurrent_gated_delta_product(q[:, :1], k[:, :n], v[:, :n], None if gate is None else gate[:, :1],
                                                beta[:, :n], num_householder=n, initial_state=h0,
                                                output_final_state=True)
    want = {"DPX_KERNEL_BWD_FP32": bwd_fp32, **({} if dqkwg is None else {"DPX_KERNEL_DQKWG": dqkwg})}
    old = {k: os.environ.get(k) for k in want}
    os.environ.update(want)
    try:
        return capture(step)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v


def conv_x_loads(width: int, offset: int, channels: int, group: int, dtype: str = "bf16", cc: int = 90) -> dict:
    """The global loads of the short-conv kernels (kernels/fused/short_conv.py, forward and backward) when x is the
    column slice [offset, offset + channels) of a [B, T, width] projection output, as the mixer's fused input GEMM
    gives them: {kernel: {PTX load instruction: count}}, from the real launch path (the launches are recorded, not
    run) compiled for sm_cc with the JIT's divisibility specialization. A row stride that is no multiple of 16
    elements is not specialized, and every load of x becomes a 2-byte `ld.global.b16` (session 20)."""
    from collections import Counter

    from dpx.kernels.fused import short_conv as sc
    seen = []
    orig = JITFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        seen.append((self, {**dict(zip([p.name for p in self.params], args)), **kwargs}))

    JITFunction.run = run
    try:
        base = torch.zeros(1, 64, width, dtype=DTYPES[dtype], requires_grad=True)
        x = base[..., offset:offset + channels]
        w = torch.randn(channels, 4, requires_grad=True)
        y = sc.CausalConv1dFn.apply(x, w, None, None, True, group, 1e-6)
        y.backward(torch.zeros_like(y))
    finally:
        JITFunction.run = orig
    out = {}
    for jf, values in seen:
        cfg = triton.Config({}, num_warps=values.pop("num_warps", 4), num_stages=values.pop("num_stages", 1))
        values = {p.name: values[p.name] for p in jf.params}
        sig, consts = signature(jf, values, cfg)
        c = triton.compile(ASTSource(fn=jf, signature=sig, constexprs=consts,
                                     attrs={(i,): [["tt.divisibility", 16]] for i in aligned(jf, values, cfg)}),
                           target=GPUTarget("cuda", cc, 32), options={"num_warps": cfg.num_warps,
                                                                        "num_stages": cfg.num_stages})
        out[jf.__name__] = dict(Counter(re.findall(r"ld\.global[.\w]*", c.asm["ptx"])))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--dims", default="64,128,256", help="d_k = d_v")
    ap.add_argument("--ns", default="1,2,3,4,8")
    ap.add_argument("--gated", type=int, default=1)
    ap.add_argument("--bwd-fp32", default="", help="DPX_KERNEL_BWD_FP32 for the backward launches (0, 1 or '')")
    ap.add_argument("--dqkwg", choices=("fused", "split", "both"), default=None,
                    help="DPX_KERNEL_DQKWG for the backward launches (both: each; default: as the environment has it)")
    ap.add_argument("--kernels", default="", help="only kernels whose name contains one of these (comma list)")
    ap.add_argument("--cc", type=int, default=90)
    ap.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)),
                    help="parallel compiles (spawned processes; default: this machine's cores)")
    ap.add_argument("--out", type=Path, help="also write the markdown table here")
    ap.add_argument("--json", type=Path, help="also write every launch and its configs' results here")
    ap.add_argument("--whole-space", action="store_true",
                    help="every config of each kernel's autotune space, none of kernels/delta_product/"
                    "autotune_spaces.py's pruning (where the tree has it: benchmarks/pending/autotune-spaces.patch); "
                    "what `autotune_wins.py --spaces --fits` reads")
    a = ap.parse_args(argv)
    if a.whole_space:
        try:  # a pruned kernel that is widened tries its whole space (the fallback after an OutOfResources)
            from dpx.kernels.delta_product import autotune_spaces
            autotune_spaces.WIDENED.update(autotune_spaces.SPACES)
        except ImportError:
            pass  # a tree without pruned spaces: every launch already lists its whole space

    # pass 1: record every launch and its configs; pass 2: compile each distinct (kernel, config) once, `--jobs` at
    # a time in spawned processes (a compile is a single-threaded MLIR/LLVM/ptxas pipeline: 2 cores, 2x)
    jobs: dict = {}  # key -> (job, printed label parts)
    plan = []        # (launch dict, [(label, key)])
    t0 = time.time()
    wanted = [k for k in a.kernels.split(",") if k]
    for dname in a.dtypes.split(","):
        for d in map(int, a.dims.split(",")):
            for n in map(int, a.ns.split(",")):
                modes = ("fused", "split") if a.dqkwg == "both" else (a.dqkwg,)
                for jf, values, configs in [x for m in modes
                                            for x in launches(DTYPES[dname], d, n, bool(a.gated), a.bwd_fp32, m)]:
                    if wanted and not any(w in jf.__name__ for w in wanted):
                        continue
                    launch = {"kernel": jf.__name__, "dtype": dname, "d": d, "n_h": n, "configs": []}
                    cfgs = []
                    for cfg in configs:
                        sig, consts = signature(jf, values, cfg)
                        div16 = aligned(jf, values, cfg)
                        label = " ".join([f"{k}={v}" for k, v in cfg.kwargs.items()]
                                         + [f"w={cfg.num_warps}", f"s={cfg.num_stages}"])
                        key = (jf.__name__, tuple(sorted(sig.items())), tuple(sorted(map(str, consts.items()))),
                               cfg.num_warps, cfg.num_stages, div16)
                        if key not in jobs:
                            dts = sorted({t[1:] for t in sig.values() if t.startswith("*")} - {"i32", "i64"})
                            blocks = " ".join([f"{c}={consts[c]}" for c in ("BT", "BK", "BV")
                                               if c in consts and c not in cfg.kwargs]
                                              + [c for c, x in consts.items() if x is True])  # flags set
                            jobs[key] = ((jf.fn.__module__, jf.__name__, sig, consts, cfg.num_warps, cfg.num_stages,
                                          a.cc, div16), (jf.__name__, "/".join(dts), d, n, blocks, label))
                        cfgs.append((label, key))
                    plan.append((launch, cfgs))
    print(f"[kernel_resources] {len(jobs)} distinct (kernel, config) builds for sm_{a.cc}, {a.jobs} at a time",
          flush=True)
    done: dict = {}

    def finished(key, r):
        done[key] = r
        name, dts, d, n, blocks, label = jobs[key][1]
        print(f"[{time.time() - t0:5.0f}s] {name} {dts} d={d} n_h={n} {blocks} {label}: "
              + (r.get("error") or f"shared {r['shared']} B ({'yes' if fits(r) else '**NO**'}), {r['regs']} "
                                   f"regs, spill {r['spill_st']}/{r['spill_ld']} B"), flush=True)

    if a.jobs <= 1 or len(jobs) <= 1:
        for key, (job, _) in jobs.items():
            finished(key, _compile_job(job))
    else:
        with ProcessPoolExecutor(a.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futs = {pool.submit(_compile_job, job): key for key, (job, _) in jobs.items()}
            for f in as_completed(futs):
                finished(futs[f], f.result())
    rows = [(*info, done[key]) for key, (_, info) in jobs.items()]
    report = []
    for launch, cfgs in plan:
        launch["configs"] = [{"config": label, **done[key]} for label, key in cfgs]
        launch["fits"] = any(fits(c) for c in launch["configs"])
        report.append(launch)
    lines = [f"Limit: {HOPPER_SHARED_LIMIT:,} B of shared memory per block (sm_{a.cc}); Triton {triton.__version__}.",
             "", "| kernel | dtypes | d | n_h | blocks, flags | config | shared (B) | fits | regs | spill st/ld (B) "
             "| bar.sync / shfl (PTX) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, dts, d, n, blocks, cfg, r in rows:
        if "error" in r:
            lines.append(f"| {name} | {dts} | {d} | {n} | {blocks} | {cfg} | – | compile error: {r['error']} | | | |")
            continue
        lines.append(f"| {name} | {dts} | {d} | {n} | {blocks} | {cfg} | {r['shared']:,} | "
                     f"{'yes' if fits(r) else '**no**'} | {r['regs']} "
                     f"| {r['spill_st']:,}/{r['spill_ld']:,} | {r.get('barriers', '–')} / {r.get('shuffles', '–')} |")
    table = "\n".join(lines)
    if a.out:
        a.out.write_text(table + "\n")
    if a.json:
        a.json.write_text(json.dumps({"limit": HOPPER_SHARED_LIMIT, "triton": triton.__version__, "cc": a.cc,
                                      "launches": report}, indent=1))
    print(table)
    stuck = [f"{x['kernel']} {x['dtype']} d={x['d']} n_h={x['n_h']}" for x in report if not x["fits"]]
    if stuck:
        print(f"kernel_resources: no config fits for {len(stuck)} launch(es): " + "; ".join(stuck), file=sys.stderr)
    return 1 if stuck else 0


if __name__ == "__main__":
    sys.exit(main())
