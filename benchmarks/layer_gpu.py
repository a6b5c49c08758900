"""The delta layer on one GPU (issue 15): fused-op checks, a per-op profile beside fla, layer and LM throughput.

    source .ci/device_setup.sh && python3 benchmarks/layer_gpu.py --out $OUT      # the H200 (carry .whl)
    python3 benchmarks/layer_gpu.py --out $OUT [--wheels .whl] [--budget-s 225] [--parts check,profile,measure]
    python3 benchmarks/layer_gpu.py --out /tmp/x --device cpu --shapes tiny --parts check,measure   # CPU dry run

Imports only torch, triton, numpy, dpx.kernels and dpx.models (no dpx.tasks: the GPU image has no pydantic,
omegaconf, duckdb, mlflow). When `dpx` is not installed, a symlink shim to this checkout is put on sys.path.
`--wheels DIR` first installs DIR/*.whl (fla-core / flash-linear-attention) with pip --no-index --no-deps into a
temporary folder and puts it on sys.path.

Parts, in this order, each after the previous one (everything stops starting new work after --budget-s; a SIGALRM
interrupts a measurement that runs past it; every file is rewritten after each result):
  check    every fused op of kernels/fused (short conv + SiLU + L2 norm, L2 norm, gated RMSNorm) in float32 and
           bf16 against its plain PyTorch form in float64 on the same GPU, forward and gradients, at layer shapes
           (head dims 128 and 85, column slices of one projection, with and without a decode cache); and the
           whole mixer, fused and plain path in bf16 autocast on the autotuned delta kernel, against the plain path
           in float64 (fused no less accurate than plain).                          -> $OUT/fused_checks.json
  profile  torch.profiler of one mixer forward and one backward (separately), per op and per kernel: dpx fused,
           dpx plain (the path before this work), fla's GatedDeltaProduct, at --profile-shape (fig4, n_h=2, not
           gated: fla's gated backward refuses to run on Triton < 3.7.1).            -> $OUT/layer_profile.md
  measure  for each shape:variant of --plan: one mixer's forward + backward (bf16 autocast, median of
           --layer-iters) and the LM training step's tokens/s (bf16 autocast, float32 CE, backward, fused AdamW;
           median of --steps after --warmup), peak memory of each; dpx (fused, and the plain path's layer time)
           beside the same LM with fla's GatedDeltaProduct as every mixer.  -> $OUT/lm_throughput_<device>.json
           --compile adds the dpx model (and mixer) under torch.compile: the kernel as its custom op, the glue
           fused by the compiler (row key dpx_compiled, compiled_over_eager, compiled_over_fla).
Before anything is timed, warm-up workers (--precompile-jobs, in parallel) run each row's kernels once, so every
Triton binary is in the on-disk cache; with --compile, up to --precompile-compiled-jobs of them also compile the
row's torch.compile graphs (the mixer alone and one block of the LM, at the row's batch x length), so the timed
process reads them from inductor's and AOTAutograd's caches instead of compiling them (each compiled row records
`compile_cache`: hits and misses in the timed process).
fla's gated backward raises on Hopper with Triton >= 3.4, < 3.7.1 (fla issue #640); its gated rows are skipped
before building and a gated dpx row is compared with fla's non-gated row of the same shape and n_h
(`fla_variant` in the row says which). fla's first-call autotuning took 233 s for one shape: `--fla-configs N`
keeps N configs per fla autotuned kernel (0: all), the ones closest to 4 warps / 2 stages.

Shapes (tokens per step 32,768) and variants as benchmarks/lm_throughput.py: fig4 = 8 layers, d=1024, 12 heads x
128 at n_h=1 (matched by heads for n_h > 1: 8 heads at n_h=2, 6 at 3), 16 x 2048; table3 = 4 layers, d=512, 4
heads, head dim 128 at n_h=1 (matched by head dim: 85 at n_h=2, 64 at 3), 32 x 1024. Variant `g<n>` is gated, `<n>`
not; all with beta in [0, 2], short conv on, no output gate (the authors' LM configs).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import glob
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _setup_paths(wheels: str | None):
    """Install wheels into a temp dir (once) and make `dpx` importable (a shim of symlinks if it is not)."""
    if wheels:
        files = sorted(glob.glob(os.path.join(wheels, "*.whl")))
        if files:
            target = Path(tempfile.gettempdir()) / "dpx_layer_gpu_site"
            if not target.exists():
                r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                                    "--no-compile", "--target", str(target), *files], capture_output=True, text=True)
                if r.returncode:
                    print(f"[layer_gpu] wheel install failed: {r.stderr[-500:]}", flush=True)
            sys.path.insert(0, str(target))
    try:
        import dpx.kernels  # noqa: F401
        import dpx.models  # noqa: F401
    except ImportError:
        shim = Path(tempfile.gettempdir()) / "dpx_layer_gpu_shim"
        (shim / "dpx").mkdir(parents=True, exist_ok=True)
        for sub in ("kernels", "models"):
            link = shim / "dpx" / sub
            if not link.exists():
                link.symlink_to(REPO / sub)
        sys.path.insert(0, str(shim))
        for m in [m for m in sys.modules if m == "dpx" or m.startswith("dpx.")]:
            sys.modules.pop(m)


# the shapes, variants and the budget guard are benchmarks/lm_throughput.py's (issue 6's harness): one definition
from lm_throughput import COMMON, SHAPES, OutOfBudget, deadline, model_config  # noqa: E402

# most wanted first (the budget may end the list): the issue's row, its gated twin, then every fla comparison,
# then the remaining gated rows (each compared with fla's non-gated row measured before it)
DEFAULT_PLAN = ("fig4:2,fig4:g2,table3:2,fig4:1,fig4:3,table3:1,table3:3,table3:g2,fig4:g1,fig4:g3,table3:g1,"
                "table3:g3")


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]


# -- models --------------------------------------------------------------------------------------------------------

FLA_SOURCE = {"layer": ""}  # which fla layer the comparison runs (said in the JSON)


def fla_layer_class():
    """fla's GatedDeltaProduct (flash-linear-attention's fla.layers; through a bare fla.layers stub when its
    __init__ needs transformers). Without flash-linear-attention (only fla-core: fla.ops + fla.modules, as
    .ci/gpu_wheels.sh carries), the same layer assembled from fla-core's pieces (`_fla_core_layer`)."""
    import importlib
    import importlib.util
    import types
    import fla  # noqa: F401
    done = sys.modules.get("fla.layers.gated_deltaproduct")
    if done is not None and hasattr(done, "GatedDeltaProduct"):  # imported before (maybe through the stub)
        return done.GatedDeltaProduct
    if FLA_SOURCE["layer"].startswith("fla-core"):
        return _fla_core_layer()
    try:
        has_layers = importlib.util.find_spec("fla.layers") is not None
    except (ValueError, ImportError):
        has_layers = False
    if not has_layers:
        cls = _fla_core_layer()
        FLA_SOURCE["layer"] = ("fla-core ops in fla's GatedDeltaProduct structure (flash-linear-attention not "
                               "installed): ShortConvolution, chunk_gated_delta_product(use_qk_l2norm_in_kernel), "
                               "RMSNorm / FusedRMSNormGated, separate projections")
        return cls
    FLA_SOURCE["layer"] = "fla.layers.gated_deltaproduct.GatedDeltaProduct"
    try:
        return importlib.import_module("fla.layers.gated_deltaproduct").GatedDeltaProduct
    except ImportError as e:
        if isinstance(e, ModuleNotFoundError) and (e.name or "").startswith("fla"):
            raise
        spec = importlib.util.find_spec("fla.layers")
        for name in [m for m in sys.modules if m == "fla.layers" or m.startswith("fla.layers.")]:
            sys.modules.pop(name)
        stub = types.ModuleType("fla.layers")
        stub.__path__ = list(spec.submodule_search_locations)
        sys.modules["fla.layers"] = stub
        return importlib.import_module("fla.layers.gated_deltaproduct").GatedDeltaProduct


def _fla_core_layer():
    """fla 0.6.0's GatedDeltaProduct.forward in training mode (chunk, no cache, no padding), re-typed on fla-core:
    separate q/k/v/b(/a/g) projections, fla's ShortConvolution (SiLU), the kernel's in-kernel L2 norm, fla's
    RMSNorm (float32 weight) or FusedRMSNormGated, o_proj."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from fla.modules import FusedRMSNormGated, RMSNorm, ShortConvolution
    from fla.ops.gated_delta_product import chunk_gated_delta_product

    class GatedDeltaProductCore(nn.Module):
        def __init__(self, hidden_size, expand_v, head_dim, num_heads, mode="chunk", use_output_gate=False,
                     use_short_conv=True, conv_size=4, norm_eps=1e-5, use_forget_gate=True, allow_neg_eigval=True,
                     num_householder=2, **kw):
            super().__init__()
            H, K, n = num_heads, head_dim, num_householder
            V = int(head_dim * expand_v)
            self.H, self.K, self.V, self.n = H, K, V, n
            self.use_forget_gate, self.allow_neg_eigval = use_forget_gate, allow_neg_eigval
            self.use_output_gate, self.use_short_conv = use_output_gate, use_short_conv
            self.q_proj = nn.Linear(hidden_size, H * K, bias=False)
            self.k_proj = nn.Linear(hidden_size, H * K * n, bias=False)
            self.v_proj = nn.Linear(hidden_size, H * V * n, bias=False)
            self.b_proj = nn.Linear(hidden_size, H * n, bias=False)
            if use_forget_gate:
                self.a_proj = nn.Linear(hidden_size, H, bias=False)
                self.A_log = nn.Parameter(torch.log(torch.empty(H).uniform_(0, 16)))
                dt = torch.exp(torch.rand(H) * (math.log(0.1) - math.log(0.001)) + math.log(0.001)).clamp(min=1e-4)
                self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
            if use_short_conv:
                self.q_conv1d = ShortConvolution(hidden_size=H * K, kernel_size=conv_size, activation="silu")
                self.k_conv1d = ShortConvolution(hidden_size=H * K * n, kernel_size=conv_size, activation="silu")
                self.v_conv1d = ShortConvolution(hidden_size=H * V * n, kernel_size=conv_size, activation="silu")
            if use_output_gate:
                self.g_proj = nn.Linear(hidden_size, H * V, bias=False)
                self.o_norm = FusedRMSNormGated(V, eps=norm_eps)
            else:
                self.o_norm = RMSNorm(V, eps=norm_eps, dtype=torch.float32)
            self.o_proj = nn.Linear(H * V, hidden_size, bias=False)

        def forward(self, x, **kw):
            B, T, _ = x.shape
            H, K, V, n = self.H, self.K, self.V, self.n
            if self.use_short_conv:
                q = self.q_conv1d(x=self.q_proj(x))[0]
                k = self.k_conv1d(x=self.k_proj(x))[0]
                v = self.v_conv1d(x=self.v_proj(x))[0]
            else:
                q, k, v = F.silu(self.q_proj(x)), F.silu(self.k_proj(x)), F.silu(self.v_proj(x))
            q, k, v = q.view(B, T, H, K), k.reshape(B, T * n, H, K), v.reshape(B, T * n, H, V)
            beta = self.b_proj(x).sigmoid()
            if self.allow_neg_eigval:
                beta = beta * 2.
            beta = beta.reshape(B, T * n, H)
            g = (-self.A_log.float().exp() * F.softplus(self.a_proj(x).float() + self.dt_bias)
                 if self.use_forget_gate else None)
            o, _ = chunk_gated_delta_product(q=q, k=k, v=v, g=g, beta=beta, initial_state=None,
                                             output_final_state=False, cu_seqlens=None, num_householder=n,
                                             use_qk_l2norm_in_kernel=True)
            if self.use_output_gate:
                o = self.o_norm(o, self.g_proj(x).view(B, T, H, V))
            else:
                o = self.o_norm(o)
            return self.o_proj(o.reshape(B, T, H * V)), None, None
    return GatedDeltaProductCore


def prune_fla_autotune(n: int) -> int:
    """Keep n configs (closest to 4 warps, 2 stages; n <= 0: all) in every autotuned fla kernel imported so far,
    and turn off fla's on-disk autotune results; returns how many kernels were pruned."""
    n = n if n > 0 else 10 ** 9
    import importlib
    import pkgutil
    from triton.runtime.autotuner import Autotuner
    for pkg in ("fla.ops.gated_delta_product", "fla.ops.gated_delta_rule", "fla.ops.delta_rule", "fla.ops.common",
                "fla.ops.utils", "fla.modules"):  # kernels a call might import lazily: import them now
        try:
            p = importlib.import_module(pkg)
            for m in pkgutil.walk_packages(getattr(p, "__path__", []), pkg + "."):
                if "backends" not in m.name and "cp" not in m.name.split("."):
                    with contextlib.suppress(Exception):
                        importlib.import_module(m.name)
        except Exception:  # noqa: BLE001 - another fla version's layout
            pass
    done = 0
    for name, mod in list(sys.modules.items()):
        if not name.startswith("fla") or mod is None:
            continue
        for obj in list(vars(mod).values()):
            for _ in range(4):  # @triton.heuristics (or another wrapper) around @triton.autotune: follow .fn
                if isinstance(obj, Autotuner) or not hasattr(obj, "fn"):
                    break
                obj = obj.fn
            if isinstance(obj, Autotuner) and not getattr(obj, "_dpx_pruned", False):
                if hasattr(obj, "cache_results"):  # no autotune results from the disk cache: the warm-up workers
                    obj.cache_results = False       # tuned on a shared GPU; this process tunes for itself
                if len(obj.configs) > n:
                    obj.configs = sorted(obj.configs, key=lambda c: (abs(c.num_warps - 4), abs(c.num_stages - 2)))[:n]
                    done += 1
                obj._dpx_pruned = True
    return done


class FlaMixer:
    """Built lazily (torch imported): fla's GatedDeltaProduct behind dpx's mixer interface."""

    @staticmethod
    def make(cfg):
        import torch.nn as nn
        cls = fla_layer_class()

        class _M(nn.Module):
            def __init__(self):
                super().__init__()
                self.layer = cls(hidden_size=cfg.hidden_size, expand_v=cfg.expand_v, head_dim=cfg.key_dim,
                                 num_heads=cfg.num_heads, mode="chunk", use_output_gate=cfg.use_output_gate,
                                 use_short_conv=cfg.use_short_conv, conv_size=cfg.conv_size, norm_eps=cfg.norm_eps,
                                 use_forget_gate=cfg.use_forget_gate, allow_neg_eigval=cfg.allow_neg_eigval,
                                 num_householder=cfg.num_householder)
                self.record, self.aux = False, {}

            def forward(self, x, state=None, mode=None):
                return self.layer(x)[0], None
        return _M()


def build(cfg: dict, impl: str, device, seed: int = 0, fla_configs: int = 0):
    import torch
    from dpx.models import build_model
    torch.manual_seed(seed)
    with torch.device(device):  # initialise on the GPU (seconds faster for 150M parameters than on the CPU)
        model = build_model(cfg)
    if impl == "fla":
        for block in model.layers:
            block.attn = FlaMixer.make(model.config)
        prune_fla_autotune(fla_configs)
    return model.to(device).train()


def fla_status(device) -> str:
    try:
        fla_layer_class()
        return ""
    except Exception as e:  # noqa: BLE001 - optional dependency
        return _err(e)


def fla_refuses_gated(device) -> str:
    if device.type != "cuda":
        return ""
    try:
        from fla.utils import IS_NVIDIA_HOPPER, TRITON_ABOVE_3_4_0
    except ImportError:
        return ""
    try:
        from fla.utils import TRITON_ABOVE_3_7_1
    except ImportError:
        TRITON_ABOVE_3_7_1 = False
    if IS_NVIDIA_HOPPER and TRITON_ABOVE_3_4_0 and not TRITON_ABOVE_3_7_1:
        import triton
        return f"fla refuses its gated backward on Hopper with Triton {triton.__version__} (< 3.7.1, fla issue #640)"
    return ""


# -- timing --------------------------------------------------------------------------------------------------------

def _sync(device):
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_fn(fn, n_warmup: int, n_iters: int, device) -> dict:
    import torch
    t0 = time.perf_counter()
    for _ in range(n_warmup):
        fn()
    _sync(device)
    warm = time.perf_counter() - t0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    times = []
    for _ in range(n_iters):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    r = {"warmup_s": round(warm, 2), "median_s": statistics.median(times), "min_s": min(times), "max_s": max(times)}
    if device.type == "cuda":
        r["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2 ** 30
        r["peak_over_base_gib"] = (torch.cuda.max_memory_allocated(device) - base) / 2 ** 30
    return r


def _autocast(device):
    import torch
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16) if device.type == "cuda" else \
        contextlib.nullcontext()


def layer_step(mixer, B, T, d, device):
    import torch
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(B, T, d, generator=g).to(device).requires_grad_()
    dy = torch.randn(B, T, d, generator=g).to(device)
    params = list(mixer.parameters())

    def step():
        with _autocast(device):
            y, _ = mixer(x)
        y.backward(dy.to(y.dtype))
        x.grad = None
        for p in params:
            p.grad = None
    return step, x, dy


def lm_step(model, B, T, device):
    import torch
    import torch.nn.functional as F
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.01},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), **({"fused": True} if device.type == "cuda" else {}))
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (B, T + 1), generator=g).to(device)

    def step():
        with _autocast(device):
            logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


# -- compile warm-up in parallel ---------------------------------------------------------------------------------

def warm_one(spec: str, fla_configs: int, backend: str = "inductor", scope: str = "blocks") -> int:
    """Worker (`--_warm shape:variant:impl`): one mixer's bf16 forward + backward at the shape's sequence length,
    so that every Triton kernel of that variant is compiled into the shared on-disk cache (TRITON_CACHE_DIR).
    The autotuners compile and run every config once without timing it (the GPU is shared by the workers); the
    main process tunes from the cached binaries, which costs milliseconds per config instead of a compile."""
    import torch
    from dpx.models import ModelConfig
    from dpx.models.matching import resolve
    from dpx.models.mixers import get_mixer
    shape, variant, impl = spec.split(":")
    if os.environ.get("DPX_LAYER_GPU_FAIL_WARM") == spec:  # the tests' stand-in for a kernel fault
        raise RuntimeError(f"CUDA error: an illegal memory access was encountered (simulated for {spec})")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with contextlib.suppress(Exception):  # compile every config but time none: one run each, equal "times"
        from triton.runtime.autotuner import Autotuner

        def one_run(kernel_call, quantiles=None, **kw):
            kernel_call()
            return [1.0] * len(quantiles) if quantiles else 1.0
        Autotuner.do_bench = property(lambda self: one_run)
    if impl == "dpxc":
        return warm_compiled(shape, variant, device, backend, scope)
    c = resolve(ModelConfig.from_dict(model_config(shape, variant)))
    torch.manual_seed(0)
    with torch.device(device):
        mixer = FlaMixer.make(c) if impl == "fla" else get_mixer(c.family)(c)
    if impl == "fla":
        prune_fla_autotune(fla_configs)
    mixer.train()
    step, _, _ = layer_step(mixer, 2, SHAPES[shape]["seq_len"], c.hidden_size, device)
    step()  # (the plain path launches the same delta kernels, with torch glue: nothing more to compile)
    _sync(device)
    return 0


def warm_compiled(shape: str, variant: str, device, backend: str, scope: str) -> int:
    """Worker for a --compile row (`shape:variant:dpxc`): the graphs measure_one compiles, compiled here first, so
    that the main process finds them in torch's on-disk caches (inductor's FX graph cache, AOTAutograd's cache,
    Triton's) instead of compiling them in the timed process (session 10: 12-22 s for the mixer and 9-24 s for the
    LM, each row). The mixer alone at the row's batch x length, then, for the "blocks" scope, a one-block LM of the
    same resolved config: its block graph is the measured model's (the blocks share their code, their parameters
    are graph inputs), at a fraction of the memory, so several of these run beside each other. Prints the cache
    counters it saw (all misses on a cold cache)."""
    import torch
    import torch._inductor.config as inductor_config
    from dpx.models import ModelConfig
    from dpx.models.matching import resolve
    # inductor's kernels autotune here on a GPU the workers share: keep their picks out of the disk cache, so the
    # timed process picks its own (from the cached binaries, milliseconds)
    inductor_config.autotune_local_cache = False
    B, T = SHAPES[shape]["batch_size"], SHAPES[shape]["seq_len"]
    full = resolve(ModelConfig.from_dict(model_config(shape, variant)))
    one = full.replace(num_layers=1)
    model = build(one.to_dict(), "dpx", device)
    c = model.config
    if (c.num_heads, c.key_dim) != (full.num_heads, full.key_dim):  # matching must not see the one block
        raise RuntimeError(f"one-block config resolved to {c.num_heads} x {c.key_dim}, the row's to "
                           f"{full.num_heads} x {full.key_dim}")
    mixer = torch.compile(model.layers[0].attn, backend=backend)
    step, _, _ = layer_step(mixer, B, T, c.hidden_size, device)
    step()
    del step, mixer
    if scope == "blocks":
        from dpx.models.compile import compile_model
        lm_step(compile_model(model, scope, backend=backend), B, T, device)()
    _sync(device)
    print("compile caches:", json.dumps(_cache_counters()), flush=True)
    return 0


def _cache_counters() -> dict:
    """torch's compile-cache counters in this process: FX graph (inductor) and AOTAutograd hits and misses."""
    from torch._dynamo.utils import counters
    return {"fx_graph_hit": counters["inductor"]["fxgraph_cache_hit"],
            "fx_graph_miss": counters["inductor"]["fxgraph_cache_miss"],
            "aot_autograd_hit": counters["aot_autograd"]["autograd_cache_hit"],
            "aot_autograd_miss": counters["aot_autograd"]["autograd_cache_miss"]}


def _tail(path, n: int = 300) -> str:
    with contextlib.suppress(Exception):
        lines = [x for x in Path(path).read_text(errors="replace").splitlines() if x.strip()]
        return " | ".join(lines[-3:])[-n:]
    return ""


def canary(env: dict, spec: str) -> str:
    """'' or why `spec` must not run here: its warm-up worker died (a kernel fault there would take this process's
    CUDA context, and every later row, with it)."""
    r = (env.get("warmup") or {}).get(spec, "")
    return f"skipped: its warm-up worker {r}" if r.startswith("failed") else ""


class WarmPool:
    """Worker processes (`--_warm spec`), at most `jobs` at a time, refilled by a background thread; `join`
    waits until all are done or a wall-clock limit passes (then kills the rest)."""

    def __init__(self, specs: list[str], args, t_until: float):
        import threading
        self.queue, self.running, self.result = list(specs), [], {}
        self.args, self.t_until = args, t_until
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _start(self, spec):
        a = self.args
        log = open(Path(a.out) / f"warm_{spec.replace(':', '_')}.log", "w")
        cmd = [sys.executable, __file__, "--out", a.out, "--_warm", spec, "--fla-configs", str(a.fla_configs),
               "--compile-backend", a.compile_backend, "--compile-scope", a.compile_scope]
        if a.wheels:
            cmd += ["--wheels", a.wheels]
        try:
            p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())
        except Exception as e:  # noqa: BLE001
            log.close()
            self.result[spec] = f"not started: {_err(e)}"
            return
        self.running.append((spec, p, log, time.time()))

    def _loop(self):
        while True:
            with self.lock:
                for item in list(self.running):
                    spec, p, log, t0 = item
                    rc = p.poll()
                    if rc is not None:
                        log.close()
                        self.result[spec] = f"ok in {time.time() - t0:.0f} s" if rc == 0 else \
                            f"failed (rc {rc}): {_tail(log.name)}"
                        self.running.remove(item)
                if time.time() > self.t_until:
                    self._stop("warm-up time limit")
                    return
                while len(self.running) < self.args.precompile_jobs:
                    # a compiled-row worker holds a row's batch on the GPU: at most --precompile-compiled-jobs
                    n_c = sum(x[0].endswith(":dpxc") for x in self.running)
                    nxt = next((q for q in self.queue if not q.endswith(":dpxc")
                                or n_c < self.args.precompile_compiled_jobs), None)
                    if nxt is None:
                        break
                    self.queue.remove(nxt)
                    self._start(nxt)
                if not self.queue and not self.running:
                    return
            time.sleep(0.25)

    def _stop(self, why):
        for spec, p, log, t0 in self.running:
            p.kill()
            p.wait()
            log.close()
            self.result[spec] = f"killed ({why}, after {time.time() - t0:.0f} s)"
        for spec in self.queue:
            self.result[spec] = f"not started ({why})"
        self.running, self.queue = [], []

    def join(self) -> dict:
        self.thread.join(max(0.0, self.t_until - time.time()) + 5)
        with self.lock:
            if self.running or self.queue:
                self._stop("warm-up time limit")
        return dict(self.result)


# -- part 1: checks ------------------------------------------------------------------------------------------------

def _rel(a, b) -> float:
    a, b = a.double(), b.double()
    if not bool(a.isfinite().all()):
        return float("inf")
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


TOL = {"float32": 1e-5, "bfloat16": 1e-2}  # relative RMS vs float64 on the same inputs (bf16 output rounding ~3e-3)


def _op_case(name, fast, ref, inputs, dtype, device, seed):
    """fast(*inputs in dtype) vs ref(*inputs in float64), forward and gradients of every input requiring grad.
    An exception (a compile error, say) is a result too: the row gets `error` and ok=False."""
    try:
        return _op_case1(name, fast, ref, inputs, dtype, device, seed)
    except OutOfBudget:
        raise
    except Exception as e:  # noqa: BLE001
        return {"case": name, "dtype": str(dtype).replace("torch.", ""), "errors": {}, "error": _err(e), "ok": False}


def _op_case1(name, fast, ref, inputs, dtype, device, seed):
    import torch
    if os.environ.get("DPX_LAYER_GPU_FAIL_OPS") and name.startswith("causal_conv1d"):  # the tests' fault
        raise RuntimeError("CUDA error: an illegal memory access was encountered (simulated)")
    g = torch.Generator(device="cpu").manual_seed(seed)
    outs, grads = [], []
    dy = None
    for f, dt in ((fast, dtype), (ref, torch.float64)):
        # the reference sees the same (rounded) inputs and cotangent: the errors are the op's own
        xs = [None if x is None else x.detach().to(device, dtype).to(dt).requires_grad_(x.requires_grad)
              for x in inputs]
        o = f(*xs)
        o = o[0] if isinstance(o, tuple) else o
        if dy is None:
            dy = torch.randn(o.shape, generator=g).to(device, dtype)
        o.backward(dy.to(o.dtype))
        outs.append(o)
        grads.append([x.grad if x is not None and x.requires_grad else None for x in xs])
    errs = {"y": _rel(outs[0], outs[1])}
    for i, (a, b) in enumerate(zip(*grads)):
        if b is not None:
            errs[f"d{i}"] = _rel(a, b)
    tol = TOL[str(dtype).replace("torch.", "")]
    return {"case": name, "dtype": str(dtype).replace("torch.", ""), "errors": errs, "tol": tol,
            "ok": all(e < tol for e in errs.values())}


def check_ops(device, small: bool) -> list[dict]:
    """bf16 at the specialisations the measured layers use (so the compiles are shared), float32 and the decode
    cache on one case each. Inputs are column slices of a wider tensor, as the fused path passes them."""
    import torch
    from dpx.kernels import fused

    def slice_of(x, extra=96):
        return torch.nn.functional.pad(x, (32, extra))[..., 32:32 + x.shape[-1]]

    B, T = (2, 40) if small else (4, 1024)
    bf, f32 = torch.bfloat16, torch.float32
    conv = [(bf, 128, 8, False), (bf, 85, 4, False), (bf, None, 16, False), (f32, 128, 8, True), (f32, 85, 4, False)]
    l2 = [(bf, 128), (f32, 85)]
    norm = [(bf, 128, False), (bf, 85, False), (bf, 128, True), (f32, 128, True), (f32, 85, False),
            (f32, 1024, False), (f32, 512, False)]  # the last two: the LM's block norms (fig4, table3)
    rows = []
    seed = 0
    for dt, D, heads, cache in conv:
        C = (D or 64) * heads
        seed += 1
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(B, T, C, generator=gen).requires_grad_()
        w = (0.5 * torch.randn(C, 4, generator=gen)).requires_grad_()
        c = torch.randn(B, 3, C, generator=gen) if cache else None
        rows.append(_op_case(f"causal_conv1d C={C} l2_group={D} cache={cache}",
                             lambda x, w, c, D=D: fused.causal_conv1d(slice_of(x), w, None, c, True, D, impl="triton"),
                             lambda x, w, c, D=D: fused.naive_causal_conv1d(x, w, None, c, True, D),
                             [x, w, c], dt, device, seed))
    for dt, D in l2:
        seed += 1
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(B, T, 4 * D, generator=gen).requires_grad_()
        rows.append(_op_case(f"l2norm(silu) D={D}", lambda x, D=D: fused.l2norm(slice_of(x), D, True, impl="triton"),
                             lambda x, D=D: fused.naive_l2norm(x, D, True), [x], dt, device, seed))
    for dt, D, gate in norm:
        seed += 1
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(B, T, 4, D, generator=gen).requires_grad_()
        w = (1 + 0.3 * torch.randn(D, generator=gen)).requires_grad_()
        gt = torch.randn(B, T, 4 * D, generator=gen).requires_grad_() if gate else None
        rows.append(_op_case(
            f"rms_norm_gated D={D} gate={gate}",
            lambda x, w, gt: fused.rms_norm_gated(x, w, None if gt is None else slice_of(gt), 1e-6, impl="triton"),
            lambda x, w, gt: fused.naive_rms_norm_gated(x, w, gt, 1e-6), [x, w, gt], dt, device, seed))
    return rows


CANARY_ENV: dict = {}  # main() puts the warm-up results here (check_mixer's cases are the fig4:g2, table3:2 layers)


def check_mixer(device, small: bool) -> list[dict]:
    """The whole mixer: fused path and plain path, both bf16 autocast on the Triton delta kernel (autotuned),
    against the plain path in float64 (the PyTorch chunkwise kernel, on the same device); the fused path must be
    no less accurate than the plain one. The cases are the fig4 g2 and table3 2 layers (compiles shared with the
    measurements); on the CPU, the float32 fused path against the float64 plain path instead."""
    import torch
    from dpx.models import ModelConfig
    from dpx.models.mixers.delta import DeltaProductMixer
    rows = []
    if small:
        cases, (B, T) = [("gated_deltaproduct", 64, 2, 2, 32, True), ("deltaproduct", 64, 2, 3, 16, False)], (1, 40)
    else:
        cases, (B, T) = [("gated_deltaproduct", 1024, 8, 2, 128, False), ("deltaproduct", 512, 4, 2, 85, False)], \
            (2, 512)
    for (family, d, H, n, K, out_gate), spec in zip(cases, ("fig4:g2:dpx", "table3:2:dpx")):
        why = canary(CANARY_ENV, spec)
        if why:
            rows.append({"case": f"mixer {family} d={d} H={H} n_h={n} K={K}", "ok": False, "error": why,
                         "errors_vs_plain_fp64": {}})
            continue
        kw = dict(family=family, hidden_size=d, num_heads=H, head_dim=K, num_householder=n, allow_neg_eigval=True,
                  use_output_gate=out_gate)
        torch.manual_seed(0)
        m = DeltaProductMixer(ModelConfig(**kw)).to(device)
        ref_m = DeltaProductMixer(ModelConfig(**kw, impl="torch")).to(device).double()
        ref_m.load_state_dict(m.state_dict())
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(B, T, d, generator=gen).to(device)
        dy = torch.randn(B, T, d, generator=gen).to(device)

        def run(mod, fused_on, dtype, amp):
            mod.fused = fused_on
            xx = x.to(dtype).requires_grad_()
            with (_autocast(device) if amp else contextlib.nullcontext()):
                y, st = mod(xx)
            y.backward(dy.to(y.dtype))
            gr = {k: p.grad.double() for k, p in mod.named_parameters()}
            mod.zero_grad(set_to_none=True)
            mod.fused = None
            return y.double(), st["S"].double(), xx.grad.double(), gr
        ref = run(ref_m, False, torch.float64, False)
        if device.type == "cuda":
            res = {"fused_bf16": run(m, True, torch.float32, True), "plain_bf16": run(m, False, torch.float32, True)}
        else:
            res = {"fused_fp32": run(m, True, torch.float32, False)}
        row = {"case": f"mixer {family} d={d} H={H} n_h={n} K={K} out_gate={out_gate}", "errors_vs_plain_fp64": {}}
        for key, r in res.items():
            e = {"y": _rel(r[0], ref[0]), "S": _rel(r[1], ref[1]), "dx": _rel(r[2], ref[2])}
            e["dparams_max"] = max(_rel(r[3][k], ref[3][k]) for k in ref[3])
            row["errors_vs_plain_fp64"][key] = e
        if "fused_fp32" in res:
            ok = all(v < 1e-4 for v in row["errors_vs_plain_fp64"]["fused_fp32"].values())
        else:  # the fused bf16 path no less accurate than the plain bf16 path (20% slack)
            fb, pb = row["errors_vs_plain_fp64"]["fused_bf16"], row["errors_vs_plain_fp64"]["plain_bf16"]
            ok = all(fb[k] <= 1.2 * pb[k] + 1e-3 for k in fb)
        row["ok"] = ok
        rows.append(row)
        del m, ref_m
    return rows


# -- part 2: profile -----------------------------------------------------------------------------------------------

def profile_mixer(mixer, B, T, d, device, iters: int = 3) -> dict:
    """{'fwd': [(name, calls, self device ms per iteration)], 'bwd': [...]} from torch.profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    step, x, dy = layer_step(mixer, B, T, d, device)
    for _ in range(2):
        step()
    _sync(device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    out = {}
    ys = []
    with profile(activities=acts) as pf:
        for _ in range(iters):
            with _autocast(device):
                ys.append(mixer(x)[0])
        _sync(device)
    out["fwd"] = _events(pf, iters, device)
    with profile(activities=acts) as pb:
        for y in ys:
            y.backward(dy.to(y.dtype))
        _sync(device)
    out["bwd"] = _events(pb, iters, device)
    x.grad = None
    for p in mixer.parameters():
        p.grad = None
    return out


def _events(prof, iters, device) -> dict:
    """{'kernels': [(name, calls, ms per iteration)], 'ops': [...]}: on CUDA, kernels are the device events and
    ops the CPU-side operators with the device time of the kernels they launched themselves (the two sum to the
    same total; each alone counts every kernel once); on CPU, both are the operators' self CPU time."""
    kernels, ops = [], []
    for e in prof.key_averages():
        calls = max(1, round(e.count / iters)) if iters else e.count
        if device.type != "cuda":
            if e.self_cpu_time_total > 0:
                ops.append((e.key, calls, e.self_cpu_time_total / 1e3 / iters))
            continue
        t = getattr(e, "self_device_time_total", None)
        if t is None:
            t = getattr(e, "self_cuda_time_total", 0)
        if not t or t <= 0:
            continue
        is_kernel = str(getattr(e, "device_type", "")).endswith("CUDA")
        (kernels if is_kernel else ops).append((e.key, calls, t / 1e3 / iters))
    for x in (kernels, ops):
        x.sort(key=lambda r: -r[2])
    return {"kernels": kernels or ops, "ops": ops}


CATEGORIES = (  # (label, substrings of a kernel name, lower case), first match wins
    ("GEMM (projections)", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "sm90_", "wgmma")),
    ("short conv", ("conv",)),
    ("L2 norm", ("l2norm", "l2_norm", "_l2_")),
    ("RMSNorm (+gate)", ("rms", "norm")),
    ("delta kernel", ("chunk", "wy", "recompute", "solve_tril", "kkt", "fwd_h", "bwd_dh", "dqkw", "dv_local",
                      "prepare", "cumsum", "fused_recurrent")),
    ("copies / casts / cat / fill", ("copy", "cat", "cast", "contiguous", "fill")),
    ("elementwise / reductions (torch)", ("elementwise", "vectorized", "unrolled", "reduce", "softplus", "sigmoid",
                                          "silu", "exp", "mul", "add")),
)


def _category(name: str) -> str:
    n = name.lower()
    for label, keys in CATEGORIES:
        if any(k in n for k in keys):
            return label
    return "other"


def profile_markdown(profiles: dict, title: str, top: int = 25) -> str:
    lines = [f"# {title}", ""]
    totals = {}
    cats = {}
    for part in ("fwd", "bwd"):
        for impl, prof in profiles.items():
            if isinstance(prof, str):
                continue
            for name, calls, ms in prof[part]["kernels"]:
                key = (part, impl, _category(name))
                cats[key] = cats.get(key, 0.0) + ms
    impls = [k for k, v in profiles.items() if not isinstance(v, str)]
    if impls:
        lines += ["Where the time goes (device ms per mixer call, kernels grouped by name):", "",
                  "| part | category | " + " | ".join(impls) + " |", "|---|---|" + "---|" * len(impls)]
        for part in ("fwd", "bwd"):
            for label in [c[0] for c in CATEGORIES] + ["other"]:
                vals = [cats.get((part, i, label), 0.0) for i in impls]
                if any(v > 0 for v in vals):
                    lines.append(f"| {part} | {label} | " + " | ".join(f"{v:.3f}" for v in vals) + " |")
        lines.append("")
    for part in ("fwd", "bwd"):
        for view in ("kernels", "ops"):
            for impl, prof in profiles.items():
                if isinstance(prof, str):
                    if view == "kernels":
                        lines += [f"## {part}: {impl}", "", prof, ""]
                    continue
                rows = prof[part][view]
                total = sum(r[2] for r in rows)
                if view == "kernels":
                    totals[(part, impl)] = total
                lines += [f"## {part}, per {view[:-1]}: {impl} (device time per mixer call: {total:.3f} ms)", "",
                          f"| {view[:-1]} | calls | ms | % |", "|---|---|---|---|"]
                for name, calls, ms in rows[:top]:
                    lines.append(f"| `{name[:100]}` | {calls} | {ms:.3f} | {100 * ms / max(total, 1e-12):.1f} |")
                if len(rows) > top:
                    rest = sum(r[2] for r in rows[top:])
                    lines.append(f"| ({len(rows) - top} more) | | {rest:.3f} | {100 * rest / max(total, 1e-12):.1f} |")
                lines.append("")
    summary = ["| part | " + " | ".join(k for k, v in profiles.items() if not isinstance(v, str)) + " |",
               "|---|" + "---|" * sum(not isinstance(v, str) for v in profiles.values())]
    for part in ("fwd", "bwd"):
        summary.append(f"| {part} ms | " + " | ".join(f"{totals[(part, k)]:.3f}" for k, v in profiles.items()
                                                    if not isinstance(v, str)) + " |")
    return "\n".join(lines[:2] + summary + [""] + lines[2:])  # totals first, then the categories, then the tables


# -- part 3: measurements ------------------------------------------------------------------------------------------

def measure_one(cfg, impl, shape, device, args, t_end, plain_layer: bool, compiled: bool = False) -> dict:
    """One model's layer and LM timings. compiled: the same dpx model under torch.compile (--compile: the kernel as
    its custom op, the glue fused by the compiler), the mixer compiled alone for the layer timing."""
    import torch
    B, T = SHAPES[shape]["batch_size"], SHAPES[shape]["seq_len"]
    r = {"impl": impl + (" compiled" if compiled else "")}
    model = None
    t0 = time.time()
    try:
        with deadline(t_end):
            if os.environ.get("DPX_LAYER_GPU_FAIL_MEASURE") == f"{shape}:{cfg['num_householder']}:{impl}":
                raise RuntimeError("CUDA error: an illegal memory access was encountered (simulated)")  # tests
            model = build(cfg, impl, device, args.seed, args.fla_configs)
            c = model.config
            r.update(num_params=sum(p.numel() for p in model.parameters()), num_heads=c.num_heads,
                     head_dim=c.key_dim, n_h=c.num_householder, gated=c.use_forget_gate, num_layers=c.num_layers,
                     hidden_size=c.hidden_size, batch_size=B, seq_len=T)
            if impl == "dpx":
                from dpx.kernels.delta_product.chunk import backward_path
                r["dpx_backward"] = backward_path(torch.bfloat16, c.num_householder, c.key_dim)
            mixer = model.layers[0].attn
            if compiled:
                cache0 = _cache_counters()
                from dpx.models.compile import compile_model
                backend = getattr(args, "compile_backend", "inductor")
                scope = getattr(args, "compile_scope", "blocks")
                mixer = torch.compile(mixer, backend=backend)
                model = compile_model(model, scope, backend=backend)  # the trainer's train.compile_scope
                r["compile_scope"] = scope
            step, _, _ = layer_step(mixer, B, T, c.hidden_size, device)
            r["layer"] = time_fn(step, 2, args.layer_iters, device)
            r["layer"]["ms"] = 1e3 * r["layer"]["median_s"]
            print(f"  {impl} layer fwd+bwd {r['layer']['ms']:.2f} ms (warm-up {r['layer']['warmup_s']} s)", flush=True)
            if plain_layer:
                mixer.fused = False
                r["layer_plain"] = time_fn(step, 1, args.layer_iters, device)
                r["layer_plain"]["ms"] = 1e3 * r["layer_plain"]["median_s"]
                mixer.fused = None
                print(f"  dpx plain-path layer fwd+bwd {r['layer_plain']['ms']:.2f} ms", flush=True)
            del step
            r["model"] = time_fn(lm_step(model, B, T, device), args.warmup, args.steps, device)
            r["model"]["tokens_per_s"] = B * T / r["model"]["median_s"]
            if compiled:  # did the warm-up's graphs serve this process? (hits: read from disk, misses: compiled)
                r["compile_cache"] = {k: v - cache0[k] for k, v in _cache_counters().items()}
            print(f"  {impl} LM {r['model']['tokens_per_s']:,.0f} tokens/s, peak "
                  f"{r['model'].get('peak_gib', 0):.1f} GiB (warm-up {r['model']['warmup_s']} s)", flush=True)
        r["status"] = "ok"
    except OutOfBudget as e:
        r["status"] = f"not finished: {e}"
    except Exception as e:  # noqa: BLE001 - one failure is a result
        r["status"] = f"failed: {_err(e)}"
        print(f"  {impl}: {r['status']}", flush=True)
    finally:
        r["wall_s"] = round(time.time() - t0, 1)
        del model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return r


def _get(d, *path):
    for p in path:
        d = d.get(p) if isinstance(d, dict) else None
    return d


def summarize(row: dict, fla_row: dict | None) -> None:
    d = row["dpx"]
    f = fla_row or {}
    dt, ft = _get(d, "model", "tokens_per_s"), _get(f, "model", "tokens_per_s")
    dl, fl = _get(d, "layer", "ms"), _get(f, "layer", "ms")
    row["dpx_over_fla"] = dt / ft if dt and ft else None
    row["layer_dpx_over_fla"] = fl / dl if dl and fl else None  # speed ratio (fla ms / dpx ms)
    pl = _get(d, "layer_plain", "ms")
    row["layer_fused_over_plain"] = pl / dl if dl and pl else None
    row["peak_gib"] = {"dpx": _get(d, "model", "peak_gib"), "fla": _get(f, "model", "peak_gib")}
    c = row.get("dpx_compiled") or {}
    ct = _get(c, "model", "tokens_per_s")
    if c:  # --compile: the compiled model beside the eager one and fla's
        row["compiled_over_eager"] = ct / dt if ct and dt else None
        row["compiled_over_fla"] = ct / ft if ct and ft else None
        cl = _get(c, "layer", "ms")
        row["layer_compiled_over_eager"] = dl / cl if dl and cl else None


def table(rows: list) -> str:
    lines = ["| shape | variant | params dpx/fla (M) | dpx tok/s | fla tok/s (variant) | dpx/fla | dpx layer ms | "
             "plain layer ms | fla layer ms | layer dpx/fla | peak GiB dpx/fla | status |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def f(v, spec):
        return "-" if v is None else format(v, spec)
    if any(r.get("dpx_compiled") for r in rows):  # --compile: the compiled model's tokens/s, beside eager and fla
        lines[0] = lines[0].replace("| status |", "| compiled tok/s (/eager, /fla) | status |")
        lines[1] += "---|"
    for r in rows:
        d, fl = r["dpx"], r.get("fla_ref") or {}
        pm = f"{f(_get(d, 'num_params') and d['num_params'] / 1e6, '.2f')}/" \
             f"{f(_get(fl, 'num_params') and fl['num_params'] / 1e6, '.2f')}"
        st = "; ".join(x for x in (d.get("status") != "ok" and f"dpx {d.get('status')}",
                                   r.get("fla_note")) if x) or "ok"
        lines.append(f"| {r['shape']} | {r['variant']} | {pm} | {f(_get(d, 'model', 'tokens_per_s'), ',.0f')} | "
                     f"{f(_get(fl, 'model', 'tokens_per_s'), ',.0f')} ({r.get('fla_variant') or '-'}) | "
                     f"{f(r.get('dpx_over_fla'), '.2f')} | {f(_get(d, 'layer', 'ms'), '.2f')} | "
                     f"{f(_get(d, 'layer_plain', 'ms'), '.2f')} | {f(_get(fl, 'layer', 'ms'), '.2f')} | "
                     f"{f(r.get('layer_dpx_over_fla'), '.2f')} | {f(r['peak_gib']['dpx'], '.1f')}/"
                     f"{f(r['peak_gib']['fla'], '.1f')} | " +
                     (f"{f(_get(r['dpx_compiled'], 'model', 'tokens_per_s'), ',.0f')} "
                      f"({f(r.get('compiled_over_eager'), '.2f')}, {f(r.get('compiled_over_fla'), '.2f')}) | "
                      if r.get("dpx_compiled") else ("- | " if "compiled tok/s" in lines[0] else "")) + f"{st} |")
    return "\n".join(lines)


FATAL = ("CUDA error", "illegal memory access", "device-side assert", "unspecified launch failure",
         "CUBLAS_STATUS", "cudaError")


def _fatal(rows) -> bool:
    """Whether a measured row died of a CUDA fault (after which nothing on this process's GPU context works)."""
    return any(any(f in str(r.get(k, {}).get("status", "")) for f in FATAL) for r in rows for k in ("dpx", "fla_ref"))


def _rest_in_subprocess(plan, args, out: Path, t_end: float, warmup: dict | None = None) -> list:
    left = t_end - time.time()
    if left < 20:
        return []
    sub = out / "after_fault"
    cmd = [sys.executable, __file__, "--out", str(sub), "--parts", "measure", "--plan",
           ",".join(f"{s}:{v}" for s, v in plan), "--budget-s", str(int(left - 5)), "--precompile-jobs", "0",
           "--impls", args.impls, "--warmup", str(args.warmup), "--steps", str(args.steps), "--layer-iters",
           str(args.layer_iters), "--fla-configs", str(args.fla_configs), "--device", args.device]
    if args.wheels:
        cmd += ["--wheels", args.wheels]
    if args.compile:
        cmd += ["--compile", "--compile-backend", args.compile_backend]
    print(f"[layer_gpu] a CUDA fault ended this process's GPU context: the remaining {len(plan)} rows in a fresh "
          "process", flush=True)
    with contextlib.suppress(Exception):
        subprocess.run(cmd, timeout=left, env={**os.environ, "DPX_LAYER_GPU_WARMUP": json.dumps(warmup or {})})
    rows = []
    for f in sorted(sub.glob("lm_throughput_*.json")):
        with contextlib.suppress(Exception):
            for r in json.loads(f.read_text())["rows"]:
                r["process"] = "fresh (after a CUDA fault)"
                rows.append(r)
    return rows


def resumed_rows(path: str, compiled: bool, gpu: str = "") -> tuple[dict, dict]:
    """({"shape:variant": row}, {"shape:variant": fla row}) of an earlier JSON's finished rows: dpx measured (and
    compiled, under --compile) and fla measured, refused or absent; rows that a budget or a fault cut short (a
    status "not finished: ..." or "failed: ...") are measured again. Nothing is kept from a file measured on
    another GPU model than `gpu`: its fla rows would be the anchors of this run's dpx rows (session 21: a resumed
    H200 file's fla rows set against H100 dpx rows gave 0.90 where the same-card ratio was 1.23)."""
    if not path:
        return {}, {}
    rep = json.loads(Path(path).read_text())
    was = rep.get("env", {}).get("gpu", "")
    if gpu and was != gpu:
        print(f"[layer_gpu] --resume: {path} was measured on {was or 'an unnamed device'}, this run is on {gpu}: "
              "nothing kept, every row measured again", flush=True)
        return {}, {}
    ok = lambda r: isinstance(r, dict) and r.get("status") == "ok"
    cut = lambda r: isinstance(r, dict) and str(r.get("status", "")).startswith(("not finished", "failed"))
    fla = {k: r for k, r in rep.get("fla_rows", {}).items() if ok(r)}
    rows = {}
    for r in rep.get("rows", []):
        if ok(r.get("dpx")) and (not compiled or ok(r.get("dpx_compiled"))) and not cut(r.get("fla_ref")):
            rows[f"{r['shape']}:{r['variant']}"] = r
    return rows, fla


def _plan(args) -> list:
    if args.plan:
        return [tuple(p.split(":")) for p in args.plan.split(",")]
    if args.shapes:
        return [(s, v) for s in args.shapes.split(",") for v in args.variants.split(",")]
    return [tuple(p.split(":")) for p in DEFAULT_PLAN.split(",")]


# -- main ------------------------------------------------------------------------------------------------------------

def environment(device) -> dict:
    import torch
    env = {"date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "host": platform.node(),
           "python": platform.python_version(), "torch": torch.__version__, "device": str(device)}
    with contextlib.suppress(Exception):
        env["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                                       cwd=REPO).stdout.strip()
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    for mod in ("triton", "fla"):
        with contextlib.suppress(Exception):
            env[mod] = __import__(mod).__version__
    return env


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--wheels", default="", help="install DIR/*.whl (fla) into a temp dir first")
    ap.add_argument("--parts", default="check,profile,measure")
    ap.add_argument("--plan", default="", help=f"shape:variant,... in this order (default: {DEFAULT_PLAN})")
    ap.add_argument("--shapes", default="", help="instead of --plan: these shapes x --variants")
    ap.add_argument("--variants", default="2,g2,1,g1,3,g3")
    ap.add_argument("--impls", default="dpx,fla")
    ap.add_argument("--compile", action="store_true",
                    help="also time the dpx model and mixer under torch.compile (row key dpx_compiled)")
    ap.add_argument("--compile-backend", default="inductor", help="torch.compile backend for --compile")
    ap.add_argument("--compile-scope", default="blocks", choices=("blocks", "model"),
                    help="--compile: each block compiled on its own (train.compile_scope's default) or the whole model "
                         "(sessions 8-9 measured 'model')")
    ap.add_argument("--profile-shape", default="fig4:2")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--layer-iters", type=int, default=10)
    ap.add_argument("--budget-s", type=float, default=225.0)
    ap.add_argument("--fla-configs", type=int, default=2, help="autotune configs kept per fla kernel (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--precompile-jobs", type=int, default=18, help="parallel compile warm-up workers (0: none)")
    ap.add_argument("--precompile-compiled-jobs", type=int, default=4,
                    help="with --compile: of those, at most this many compile a row's torch.compile graphs at its "
                    "batch x length (one block of the LM, ~15 GB at fig4), so the timed process reads them from the "
                    "on-disk caches (0: none)")
    ap.add_argument("--precompile-s", type=float, default=120.0, help="warm-up workers are killed this many "
                    "seconds after the start")
    ap.add_argument("--resume", default="", help="a JSON this script wrote: its finished rows are kept and not "
                    "measured again (nor warmed up), so a plan longer than one GPU call runs over several")
    ap.add_argument("--_warm", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    os.environ.setdefault("TRITON_CACHE_DIR", str(Path(tempfile.gettempdir()) / "dpx_layer_gpu_triton"))
    # autotune results never from disk: the warm-up workers' "timings" are placeholders (each process tunes itself)
    os.environ.pop("TRITON_CACHE_AUTOTUNING", None)
    os.environ["FLA_CACHE_RESULTS"] = "0"
    if args._warm:
        _setup_paths(args.wheels or None)
        return warm_one(args._warm, args.fla_configs, args.compile_backend, args.compile_scope)
    t_start = time.time()
    t_end = t_start + args.budget_s
    _setup_paths(args.wheels or None)
    import torch
    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type != "cuda" and "triton" not in sys.modules:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # the CPU dry run checks the Triton ops interpreted
    small = device.type != "cuda"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    parts = set(args.parts.split(","))
    impls = args.impls.split(",")
    fla_err = fla_status(device) if "fla" in impls else "not requested"
    if fla_err:
        print(f"[layer_gpu] fla not measured: {fla_err}", flush=True)
    env = environment(device)
    env.update(fla_error=fla_err, fla_layer=FLA_SOURCE["layer"], args=vars(args))
    print(f"[layer_gpu] {json.dumps(env)}", flush=True)
    plan = _plan(args)
    kept, kept_fla = resumed_rows(args.resume, args.compile, env.get("gpu", ""))
    if kept:
        plan = [p for p in plan if f"{p[0]}:{p[1]}" not in kept]
        print(f"[layer_gpu] --resume: {len(kept)} finished rows kept from {args.resume}; {len(plan)} to measure",
              flush=True)
    warm = None
    if os.environ.get("DPX_LAYER_GPU_WARMUP"):  # a fresh process after a fault: the parent's warm-up results
        with contextlib.suppress(Exception):
            env["warmup"] = CANARY_ENV["warmup"] = json.loads(os.environ["DPX_LAYER_GPU_WARMUP"])
    if (device.type == "cuda" or os.environ.get("DPX_LAYER_GPU_WARM_CPU")) and args.precompile_jobs > 0 \
            and parts & {"profile", "measure"}:
        specs = []
        prof = [("tiny" if small else args.profile_shape.split(":")[0], args.profile_shape.split(":")[1])]
        if args.compile and "measure" in parts and args.precompile_compiled_jobs > 0:  # the longest first
            specs += [f"{shape}:{variant}:dpxc" for shape, variant in plan]
        for shape, variant in (prof if "profile" in parts else []) + (plan if "measure" in parts else []):
            specs.append(f"{shape}:{variant}:dpx")
            if "fla" in impls and not fla_err:
                fv = variant[1:] if variant.startswith("g") and fla_refuses_gated(device) else variant
                if f"{shape}:{fv}" not in kept_fla:
                    specs.append(f"{shape}:{fv}:fla")
        warm = WarmPool(list(dict.fromkeys(specs)), args, min(t_end, t_start + args.precompile_s))
        print(f"[layer_gpu] compile warm-up: {len(dict.fromkeys(specs))} workers, {args.precompile_jobs} at a time",
              flush=True)

    checks = {"env": env, "ops": [], "mixer": [], "status": "not run"}

    def save_checks():
        checks["all_ok"] = bool(checks["ops"]) and all(r["ok"] for r in checks["ops"] + checks["mixer"])
        (out / "fused_checks.json").write_text(json.dumps(checks, indent=1))

    def run_checks(fn, key):
        t0 = time.time()
        try:
            with deadline(t_end):
                checks[key] = fn(device, small)
            checks["status"] = "ok"
        except OutOfBudget as e:
            checks["status"] = f"not finished: {e}"
        except Exception as e:  # noqa: BLE001
            checks["status"] = f"failed in {key}: {_err(e)}"
            print(f"[layer_gpu] checks {checks['status']}", flush=True)
        for r in checks[key]:
            if key == "ops":
                print(f"  check {'ok  ' if r['ok'] else 'FAIL'} {r['dtype']:8} {r['case']}: "
                      + (r.get("error") or ", ".join(f"{k} {v:.1e}" for k, v in r["errors"].items())), flush=True)
            else:
                print(f"  check {'ok  ' if r['ok'] else 'FAIL'} {r['case']}: " + (r.get("error") or json.dumps(
                    {k: {a: f'{b:.1e}' for a, b in v.items()} for k, v in r["errors_vs_plain_fp64"].items()})),
                    flush=True)
        checks[f"{key}_wall_s"] = round(time.time() - t0, 1)
        save_checks()

    if "check" in parts:  # the fused ops first: their compiles overlap the workers'
        run_checks(check_ops, "ops")
        broken = [f"{r['dtype']} {r['case']}: {r['error']}" for r in checks["ops"] if r.get("error")]
        if broken:  # a fused op that cannot run: measure the plain path rather than nothing, and say so
            os.environ["DPX_FUSED"] = "0"
            env["fused_disabled"] = "DPX_FUSED=0 set after failed op checks: " + "; ".join(broken)[:1000]
            print(f"[layer_gpu] {env['fused_disabled']}", flush=True)
    if warm is not None:  # nothing timed runs while workers share the GPU
        t0 = time.time()
        env["warmup"] = warm.join()
        CANARY_ENV["warmup"] = env["warmup"]
        env["warmup_wall_s"] = round(time.time() - t0, 1)
        print(f"[layer_gpu] compile warm-up: waited {env['warmup_wall_s']} s more: {env['warmup']}", flush=True)
    def fatal_checks() -> bool:
        texts = [str(r.get("error", "")) for r in checks["ops"] + checks["mixer"]] + [checks["status"]]
        return any(f in t for t in texts for f in FATAL)

    def rest_fresh(rest: list) -> int:
        """A CUDA fault in this process: the remaining parts in a fresh one (fused path off if an op faulted),
        writing into the same folder."""
        left = t_end - time.time()
        print(f"[layer_gpu] a CUDA fault in the checks: {','.join(rest)} in a fresh process", flush=True)
        cmd = [sys.executable, __file__, "--out", str(out), "--parts", ",".join(rest), "--budget-s",
               str(max(1, int(left - 5))), "--precompile-jobs", "0", "--impls", args.impls, "--plan",
               ",".join(f"{a}:{b}" for a, b in plan), "--profile-shape", args.profile_shape, "--warmup",
               str(args.warmup), "--steps", str(args.steps), "--layer-iters", str(args.layer_iters),
               "--fla-configs", str(args.fla_configs), "--device", args.device] + \
            (["--wheels", args.wheels] if args.wheels else []) + \
            (["--compile", "--compile-backend", args.compile_backend] if args.compile else [])
        with contextlib.suppress(Exception):
            subprocess.run(cmd, timeout=max(1.0, left),
                           env={**os.environ, "DPX_LAYER_GPU_WARMUP": json.dumps(env.get("warmup") or {})})
        return 0

    if "check" in parts and fatal_checks():
        if warm is not None:
            env["warmup"] = warm.join()
        save_checks()
        return rest_fresh([p for p in ("profile", "measure") if p in parts])
    if "check" in parts:  # the mixer after the warm-up: its delta kernels are cached by then
        run_checks(check_mixer, "mixer")
        if fatal_checks():
            return rest_fresh([p for p in ("profile", "measure") if p in parts])
        print(f"[layer_gpu] checks: {'all ok' if checks['all_ok'] else 'NOT all ok'} ({checks['status']})",
              flush=True)

    if "profile" in parts:
        t0 = time.time()
        shape, variant = args.profile_shape.split(":")
        if small:
            shape = "tiny"
        cfg = model_config(shape, variant)
        B, T = SHAPES[shape]["batch_size"], SHAPES[shape]["seq_len"]
        profiles = {}
        for impl in ("dpx fused", "dpx plain", "fla"):
            if impl == "fla" and (fla_err or (variant.startswith("g") and fla_refuses_gated(device))):
                profiles[impl] = f"not profiled: {fla_err or fla_refuses_gated(device)}"
                continue
            why = canary(env, f"{shape}:{variant}:{'fla' if impl == 'fla' else 'dpx'}")
            if why:
                profiles[impl] = f"not profiled: {why}"
                continue
            try:
                with deadline(t_end):
                    model = build(cfg, "fla" if impl == "fla" else "dpx", device, args.seed, args.fla_configs)
                    mixer = model.layers[0].attn
                    if impl == "dpx plain":
                        mixer.fused = False
                    profiles[impl] = profile_mixer(mixer, B, T, model.config.hidden_size, device)
                    del model, mixer
            except OutOfBudget as e:
                profiles[impl] = f"not profiled: {e}"
            except Exception as e:  # noqa: BLE001
                profiles[impl] = f"not profiled: {_err(e)}"
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        title = (f"One mixer, {shape} variant {variant} (B={B}, T={T}, bf16 autocast): self device time per op/kernel "
                 f"({env.get('gpu', device.type)}, torch {env['torch']}, triton {env.get('triton')}, fla "
                 f"{env.get('fla', '-')}, commit {env.get('commit', '?')[:10]}, {env['date_utc']} UTC)")
        (out / "layer_profile.md").write_text(profile_markdown(profiles, title) + "\n")
        (out / "layer_profile.json").write_text(json.dumps(profiles, indent=1))
        print(f"[layer_gpu] profile written ({time.time() - t0:.0f} s)", flush=True)

    if "measure" in parts:
        report = {"env": env, "rows": list(kept.values()), "fla_rows": dict(kept_fla)}
        if kept:
            env["resumed_from"] = {"file": args.resume, "rows": list(kept)}
        name = out / f"lm_throughput_{'h200' if 'H200' in env.get('gpu', '') else device.type}.json"
        fla_rows = report["fla_rows"]
        for i_row, (shape, variant) in enumerate(plan):
            if _fatal(report["rows"]):  # this process's CUDA context is gone: the rest in a fresh process
                report["rows"] += _rest_in_subprocess(plan[i_row:], args, out, t_end, env.get("warmup"))
                break
            print(f"[layer_gpu] {shape}:{variant} ({time.time() - t_start:.0f} s)", flush=True)
            cfg = model_config(shape, variant)
            row = {"shape": shape, "variant": variant, "n_h": int(variant.lstrip("g")),
                   "gated": variant.startswith("g")}
            why = canary(env, f"{shape}:{variant}:dpx")
            row["dpx"] = {"impl": "dpx", "status": why} if why else \
                measure_one(cfg, "dpx", shape, device, args, t_end, plain_layer=True)
            if args.compile and not why and row["dpx"].get("status") == "ok":
                row["dpx_compiled"] = measure_one(cfg, "dpx", shape, device, args, t_end, plain_layer=False,
                                                  compiled=True)
            fla_v = variant
            note = ""
            if "fla" in impls and not fla_err:
                if variant.startswith("g") and fla_refuses_gated(device):
                    fla_v = variant[1:]
                    note = f"{fla_refuses_gated(device)}: compared with fla's non-gated {shape}:{fla_v}"
                key = f"{shape}:{fla_v}"
                if key not in fla_rows:
                    why = canary(env, f"{key}:fla")
                    fla_rows[key] = {"impl": "fla", "status": why} if why else \
                        measure_one(model_config(shape, fla_v), "fla", shape, device, args, t_end, plain_layer=False)
                row["fla_ref"] = fla_rows[key]
                row["fla_variant"] = fla_v
                if fla_rows[key].get("status") != "ok":
                    note = (note + "; " if note else "") + f"fla {fla_rows[key].get('status')}"
            else:
                note = f"fla not measured: {fla_err}"
            row["fla_note"] = note
            summarize(row, row.get("fla_ref"))
            report["rows"].append(row)
            name.write_text(json.dumps(report, indent=1, default=str))
            (out / "lm_throughput_table.md").write_text(table(report["rows"]) + "\n")  # a killed run keeps both
        report["table"] = table(report["rows"])
        name.write_text(json.dumps(report, indent=1, default=str))
        (out / "lm_throughput_table.md").write_text(report["table"] + "\n")
        print(report["table"], flush=True)
    print(f"[layer_gpu] done in {time.time() - t_start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
