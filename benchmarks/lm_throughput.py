"""Training throughput of the dpx LM against the same LM built on fla's GatedDeltaProduct layer (issue 6).

    python benchmarks/lm_throughput.py --out DIR [--shapes fig4,table3] [--variants g2,g3,g1] [--budget-s 300]
    python benchmarks/lm_throughput.py --out DIR --shapes tiny --device cpu        # CPU dry run (fla skipped)

For each shape and variant, two models that differ only in the token mixer: dpx's `LanguageModel` (models/lm.py)
as built from the recipe's model section, and the same wrapper with every mixer replaced by fla's
`GatedDeltaProduct` at the same hidden size, heads, head dim, n_h, gate, short conv and output gate
(`tasks/lm/throughput.py:use_fla_mixers`; embeddings, norms, MLPs and head are the same modules). Both parameter
counts are printed. Per pair:
  - model: tokens/s of a full training step (bf16 autocast, cross-entropy on float logits, backward, fused AdamW),
    after `--warmup` untimed steps (Triton compilation and fla's first-call autotuning happen there, minutes per
    new shape); median and mean over `--steps` steps timed with CUDA events;
  - layer: forward + backward of one mixer alone on x [B, T, d] (bf16 autocast), median of `--layer-iters`.
dpx and fla are measured back to back per variant, so a ratio compares two numbers from the same minutes.

Variants: `g<n>` gated (Gated DeltaProduct, n_h = n; g1 is Gated DeltaNet), `<n>` not gated (DeltaProduct_n;
1 is DeltaNet); all with eigenvalues in [-1, 1] (beta in [0, 2]) as the paper's LM runs.
Shapes (tokens per step 32,768):
  fig4    recipes/fig4_throughput.yaml scale=gpu_small: 8 layers, d=1024, 12 heads x 128 for n_h = 1 and matched
          by heads for n_h > 1 (~150M), 2048 x 16
  table3  recipes/table3.yaml scale=gpu_small: 4 layers, d=512, 4 heads, head dim 128 for n_h = 1 and matched by
          head dim for n_h > 1 (~30M), 1024 x 32
  tiny    CPU dry run: 2 layers, d=64, 2 heads x 32, vocab 512, 64 x 4

Everything stops starting new work after `--budget-s` seconds (a SIGALRM also interrupts a measurement that
runs past it, e.g. a long autotune); what finished is in the table and in DIR/lm_throughput.json, written after
every measurement. fla is optional: when it does not import, its rows say why and dpx is measured alone.
fla 0.6.0 refuses its gated backward on Hopper with Triton < 3.7.1 (its issue #640; the H200 image has Triton
3.6): there, gated variants are measured for dpx alone and the fla comparison needs the non-gated ones
(`--plan fig4:2,fig4:3,table3:2,fig4:1`).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

SHAPES = {
    "fig4": dict(model=dict(num_layers=8, hidden_size=1024, num_heads=12, head_dim=128,
                            matching={"mode": "heads", "reference": {"num_householder": 1}}),
                 seq_len=2048, batch_size=16),
    "table3": dict(model=dict(num_layers=4, hidden_size=512, num_heads=4, head_dim=128,
                              matching={"mode": "head_dim", "reference": {"num_householder": 1, "head_dim": 128}}),
                   seq_len=1024, batch_size=32),
    "tiny": dict(model=dict(num_layers=2, hidden_size=64, num_heads=2, head_dim=32, vocab_size=512), seq_len=64,
                 batch_size=4),
}
COMMON = dict(vocab_size=32000, expand_v=1.0, allow_neg_eigval=True, use_short_conv=True, use_output_gate=False,
              tie_embeddings=True)


class OutOfBudget(BaseException):
    """The budget ran out (raised by SIGALRM anywhere inside a measurement). A BaseException, like
    KeyboardInterrupt, so that an `except Exception` in model building or in a library cannot swallow it: it once
    did under load, and the row then ran on past the budget."""


def model_config(shape: str, variant: str) -> dict:
    gated = variant.startswith("g")
    n_h = int(variant.lstrip("g"))
    cfg = {**COMMON, **SHAPES[shape]["model"], "num_householder": n_h,
           "family": "gated_deltaproduct" if gated else "deltaproduct"}
    if n_h == 1:
        cfg.pop("matching", None)  # the reference itself
    return cfg


def build(cfg: dict, impl: str, device: torch.device, seed: int = 0):
    """The dpx LM, or the same LM with fla's GatedDeltaProduct as every mixer (same seed for the shared modules)."""
    from dpx.models import build_model
    torch.manual_seed(seed)
    model = build_model(cfg)
    if impl == "fla":
        from dpx.tasks.lm.throughput import use_fla_mixers
        use_fla_mixers(model)
    return model.to(device).train()


def _timer(device: torch.device):
    """start(), stop() -> seconds; CUDA events on the GPU (no host sync inside the timed region)."""
    if device.type == "cuda":
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        return (lambda: a.record()), (lambda: (b.record(), b.synchronize(), a.elapsed_time(b) / 1e3)[-1])
    t = [0.0]
    return (lambda: t.__setitem__(0, time.perf_counter())), (lambda: time.perf_counter() - t[0])


def time_steps(step, n_warmup: int, n_steps: int, device: torch.device) -> dict:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    for _ in range(n_warmup):
        step()
    sync()
    warm_s = time.perf_counter() - t0
    start, stop = _timer(device)
    times = []
    t0 = time.perf_counter()
    for _ in range(n_steps):
        start()
        step()
        times.append(stop())
    sync()
    return {"warmup_s": warm_s, "median_s": statistics.median(times), "mean_s": (time.perf_counter() - t0) / n_steps,
            "min_s": min(times), "max_s": max(times)}


def measure_model(model, B: int, T: int, device: torch.device, n_warmup: int, n_steps: int) -> dict:
    from dpx.tasks.training.config import TrainConfig
    from dpx.tasks.training.loop import autocast, make_optimizer
    opt = make_optimizer(model, TrainConfig(lr=3e-4, weight_decay=0.01, betas=[0.9, 0.95]), device)
    g = torch.Generator().manual_seed(0)  # random tokens: throughput does not depend on the text
    ids = torch.randint(0, model.config.vocab_size, (B, T + 1), generator=g).to(device)

    def step():
        with autocast(device):
            logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    r = time_steps(step, n_warmup, n_steps, device)
    r["tokens_per_s"] = B * T / r["median_s"]
    r["tokens_per_s_mean"] = B * T / r["mean_s"]
    return r


def measure_layer(model, B: int, T: int, device: torch.device, n_warmup: int, n_iters: int) -> dict:
    from dpx.tasks.training.loop import autocast
    mixer = model.layers[0].attn
    x = torch.randn(B, T, model.config.hidden_size, device=device, requires_grad=True)
    dy = torch.randn(B, T, model.config.hidden_size, device=device)

    def step():
        with autocast(device):
            y, _ = mixer(x)
        y.backward(dy.to(y.dtype))
        x.grad = None
        for p in mixer.parameters():
            p.grad = None

    r = time_steps(step, n_warmup, n_iters, device)
    r["ms"] = 1e3 * r["median_s"]
    return r


@contextlib.contextmanager
def deadline(t_end: float):
    """Raise OutOfBudget inside the block once time.time() passes t_end (SIGALRM, main thread, POSIX)."""
    left = t_end - time.time()
    if left <= 0:
        raise OutOfBudget("budget spent before start")
    if not hasattr(signal, "SIGALRM"):
        yield
        return

    def fire(signum, frame):
        raise OutOfBudget("budget spent during the measurement")
    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, left)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    # The handler's exception can be swallowed where Python ignores exceptions (a finalizer, a weakref callback,
    # gc) and the block then runs to its end past the deadline: check the clock too, so the row says so.
    if time.time() > t_end:
        raise OutOfBudget("budget spent during the measurement")


def fla_available() -> str:
    """'' when fla's GatedDeltaProduct imports, else the one-line reason."""
    try:
        from dpx.tasks.lm.throughput import fla_gated_deltaproduct
        fla_gated_deltaproduct()
        return ""
    except Exception as e:  # noqa: BLE001 - optional dependency: any import failure means "skip fla"
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]


def fla_refuses(cfg: dict, device: torch.device) -> str:
    """fla 0.6.0 raises in the gated backward (chunk_bwd_dqkwg) on Hopper with Triton >= 3.4.0, < 3.7.1 (its
    issue #640: wrong results); seen on the H200 image (Triton 3.6) after minutes of forward autotuning. Say so
    before building, so no device time goes there. '' when fla will run."""
    if device.type != "cuda" or not cfg["family"].startswith("gated"):
        return ""
    try:
        from fla.utils import IS_NVIDIA_HOPPER, TRITON_ABOVE_3_4_0, TRITON_ABOVE_3_7_1
    except ImportError:
        return ""
    if IS_NVIDIA_HOPPER and TRITON_ABOVE_3_4_0 and not TRITON_ABOVE_3_7_1:
        import triton
        return (f"skipped: fla refuses the gated backward on Hopper with Triton {triton.__version__} (< 3.7.1, "
                "fla issue #640); use a non-gated variant or Triton >= 3.7.1")
    return ""


def environment(device: torch.device, commit: str) -> dict:
    env = {"date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "host": platform.node(),
           "python": platform.python_version(), "torch": torch.__version__, "device": str(device),
           "commit": commit or _git_head()}
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    for mod in ("triton", "fla"):
        with contextlib.suppress(Exception):
            env[mod] = __import__(mod).__version__
    return env


def _git_head() -> str:
    with contextlib.suppress(Exception):
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).resolve().parent).stdout.strip()
    return "unknown"


def plan(args) -> list[tuple[str, str]]:
    """--plan shape:variant,... in that order (most wanted first: the budget may end the list), else shapes x
    variants."""
    if args.plan:
        return [tuple(p.split(":")) for p in args.plan.split(",")]
    return [(s, v) for s in args.shapes.split(",") for v in args.variants.split(",")]


def run(args) -> dict:
    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    impls = args.impls.split(",")
    fla_err = fla_available() if "fla" in impls else ""
    if fla_err:
        print(f"[lm_throughput] fla skipped: {fla_err}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"env": environment(device, args.commit), "args": vars(args), "fla_error": fla_err, "rows": []}
    t_end = time.time() + args.budget_s

    def save():
        (out / "lm_throughput.json").write_text(json.dumps(report, indent=1, default=str))

    for shape, variant in plan(args):
        B, T = args.batch_size or SHAPES[shape]["batch_size"], args.seq_len or SHAPES[shape]["seq_len"]
        cfg = model_config(shape, variant)  # dpx and fla back to back
        for impl in impls:
            row = {"shape": shape, "variant": variant, "impl": impl, "batch_size": B, "seq_len": T}
            report["rows"].append(row)
            if impl == "fla" and fla_err:
                row["status"] = "skipped: fla does not import"
                continue
            if impl == "fla" and fla_refuses(cfg, device):
                row["status"] = fla_refuses(cfg, device)
                print(f"[lm_throughput] {shape} {variant} fla: {row['status']}", flush=True)
                save()
                continue
            model, t0 = None, time.time()
            try:
                with deadline(t_end):
                    model = build(cfg, impl, device, seed=args.seed)
                    c = model.config
                    row.update(num_params=sum(p.numel() for p in model.parameters()),
                               mixer_params=sum(p.numel() for p in model.layers[0].attn.parameters()),
                               num_layers=c.num_layers, hidden_size=c.hidden_size, num_heads=c.num_heads,
                               head_dim=c.key_dim, n_h=c.num_householder, gated=c.use_forget_gate,
                               mlp_size=c.mlp_size, vocab_size=c.vocab_size)
                    if impl == "dpx":  # which backward the bf16 model takes (float32 where 16-bit is unverified)
                        from dpx.kernels.delta_product.chunk import backward_path
                        row["dpx_backward"] = backward_path(torch.bfloat16, c.num_householder, c.key_dim)
                    print(f"[lm_throughput] {shape} {variant} {impl}: {row['num_params'] / 1e6:.2f}M params "
                          f"({c.num_layers} x d={c.hidden_size}, {c.num_heads} heads x {c.key_dim}, mlp "
                          f"{c.mlp_size}), {B} x {T}", flush=True)
                    row["model"] = measure_model(model, B, T, device, args.warmup, args.steps)
                    print(f"  model: {row['model']['tokens_per_s']:,.0f} tokens/s (warm-up "
                          f"{row['model']['warmup_s']:.1f} s)", flush=True)
                    row["layer"] = measure_layer(model, B, T, device, 2, args.layer_iters)
                    print(f"  layer fwd+bwd: {row['layer']['ms']:.2f} ms", flush=True)
                    if device.type == "cuda":
                        row["peak_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2 ** 30
                row["status"] = "ok"
            except OutOfBudget as e:  # a measurement cut short (or run past the deadline) is no measurement
                for k in ("model", "layer", "peak_mem_gib"):
                    row.pop(k, None)
                row["status"] = f"not finished: {e}"
            except Exception as e:  # noqa: BLE001 - one failed measurement is a result, the rest go on
                row["status"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
                print(f"  {row['status']}", flush=True)
            finally:
                row["wall_s"] = round(time.time() - t0, 1)  # build + warm-up (compilation, autotuning) + timing
                del model
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats(device)
            save()
    save()
    return report


def table(report: dict) -> str:
    """One line per (shape, variant): both parameter counts, tokens/s, layer ms, dpx/fla ratios."""
    rows = report["rows"]
    lines = [f"{'shape':7} {'var':4} {'params dpx/fla (M)':>19} {'dpx tok/s':>11} {'fla tok/s':>11} {'dpx/fla':>7} "
             f"{'dpx layer ms':>12} {'fla layer ms':>12} {'fla/dpx':>7}  status"]
    keys = list(dict.fromkeys((r["shape"], r["variant"]) for r in rows))
    for shape, var in keys:
        by = {r["impl"]: r for r in rows if (r["shape"], r["variant"]) == (shape, var)}
        d, f = by.get("dpx", {}), by.get("fla", {})

        def get(r, *path):
            for p in path:
                r = r.get(p) if isinstance(r, dict) else None
            return r
        dt, ft = get(d, "model", "tokens_per_s"), get(f, "model", "tokens_per_s")
        dl, fl = get(d, "layer", "ms"), get(f, "layer", "ms")
        params = f"{_f(get(d, 'num_params'), 1e-6, '.2f')}/{_f(get(f, 'num_params'), 1e-6, '.2f')}"
        status = "; ".join(f"{k}: {r.get('status')}" for k, r in by.items() if r.get("status") != "ok") or "ok"
        lines.append(f"{shape:7} {var:4} {params:>19} {_f(dt, 1, ',.0f'):>11} {_f(ft, 1, ',.0f'):>11} "
                     f"{_ratio(dt, ft):>7} {_f(dl, 1, '.2f'):>12} {_f(fl, 1, '.2f'):>12} {_ratio(fl, dl):>7}  {status}")
    return "\n".join(lines)


def _f(v, scale, spec) -> str:
    return "-" if v is None else format(v * scale, spec)


def _ratio(a, b) -> str:
    return f"{a / b:.2f}" if a and b else "-"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="fig4,table3", help=f"comma list of {', '.join(SHAPES)}")
    ap.add_argument("--variants", default="g2,g3,g1", help="g<n>: gated n_h=n; <n>: not gated")
    ap.add_argument("--plan", default="", help="shape:variant,... measured in this order (overrides --shapes and "
                    "--variants), e.g. fig4:g2,fig4:g3,table3:g2")
    ap.add_argument("--impls", default="dpx,fla")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--seq-len", type=int, default=0, help="override the shape's sequence length")
    ap.add_argument("--batch-size", type=int, default=0, help="override the shape's batch size")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--layer-iters", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--commit", default="", help="commit hash to record (default: git rev-parse HEAD)")
    args = ap.parse_args(argv)
    for p in filter(None, args.plan.split(",")):
        if p.count(":") != 1:
            ap.error(f"--plan: {p!r} is not shape:variant")
    for s in {s for s, _ in plan(args)}:
        if s not in SHAPES:
            ap.error(f"--shapes: unknown shape {s!r}; known: {', '.join(SHAPES)}")
    for i in args.impls.split(","):
        if i not in ("dpx", "fla"):
            ap.error(f"--impls: unknown impl {i!r}; known: dpx, fla")
    for v in {v for _, v in plan(args)}:
        if not v.lstrip("g").isdigit() or int(v.lstrip("g")) < 1:
            ap.error(f"--variants: {v!r} is not g<n> or <n> with n >= 1")
    report = run(args)
    print(json.dumps(report["env"]))
    print(table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
