"""The `throughput` task (Fig. 4): training tokens/s of one model at one (sequence length x batch) shape.

Random tokens (throughput does not depend on the text), AdamW (fused on CUDA), bf16 autocast on CUDA. `warmup_steps`
untimed steps absorb Triton autotuning and allocator growth; then `steps` timed steps between two CUDA
synchronisations give tokens/s = batch * seq_len * steps / seconds (fla's benchmark_training_throughput.py
protocol). A recipe zips seq_len with batch_size at fixed tokens per batch and zips num_householder with
num_heads (matched by heads) or head_dim (matched by head dim).

`impl: fla` puts fla's GatedDeltaProduct layer (flash-linear-attention, optional) in place of our mixer inside the
same LM wrapper and at the same shape, so the two numbers differ only by the token mixer. `scope: layer` times
one mixer alone (forward + backward).
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
import time
import types

import torch
import torch.nn as nn
import torch.nn.functional as F

from dpx.models import num_params
from dpx.rundir import NUM_PARAMS, TOKENS_PER_S
from dpx.tasks.context import RunContext
from dpx.tasks.training.loop import autocast, make_optimizer
from dpx.tasks.training.config import TrainConfig
from dpx.tasks.training.model import build_seeded_model

from . import budget
from .config import ThroughputConfig


def fla_gated_deltaproduct():
    """fla's GatedDeltaProduct layer class. fla.layers' package __init__ imports every layer, and some of them need
    transformers; when it is missing, the one module is imported through a bare package stub instead."""
    try:
        import fla  # noqa: F401  (fla-core: optional, only `impl: fla` loads it)
    except ImportError as e:
        raise RuntimeError("task.impl: fla is not installed (pip install fla-core flash-linear-attention)") from e
    try:
        return importlib.import_module("fla.layers.gated_deltaproduct").GatedDeltaProduct
    except ImportError as e:  # transformers missing or of another API generation
        if isinstance(e, ModuleNotFoundError) and (e.name or "").startswith("fla"):
            raise RuntimeError("task.impl: fla's layers are not installed (pip install flash-linear-attention)") from e
        spec = importlib.util.find_spec("fla.layers")
        if spec is None:
            raise RuntimeError("task.impl: fla's layers are not installed (pip install flash-linear-attention)") from e
        for name in [m for m in sys.modules if m == "fla.layers" or m.startswith("fla.layers.")]:
            sys.modules.pop(name)
        stub = types.ModuleType("fla.layers")
        stub.__path__ = list(spec.submodule_search_locations)
        sys.modules["fla.layers"] = stub
        return importlib.import_module("fla.layers.gated_deltaproduct").GatedDeltaProduct


class FlaMixer(nn.Module):
    """fla's GatedDeltaProduct behind our mixer interface (full-sequence forward only, no state passing)."""

    def __init__(self, cfg):
        super().__init__()
        cls = fla_gated_deltaproduct()
        self.layer = cls(hidden_size=cfg.hidden_size, expand_v=cfg.expand_v, head_dim=cfg.key_dim,
                         num_heads=cfg.num_heads, mode="chunk", use_output_gate=cfg.use_output_gate,
                         use_short_conv=cfg.use_short_conv, conv_size=cfg.conv_size, norm_eps=cfg.norm_eps,
                         use_forget_gate=cfg.use_forget_gate, allow_neg_eigval=cfg.allow_neg_eigval,
                         num_householder=cfg.num_householder)
        self.record, self.aux = False, {}

    def forward(self, x, state=None, mode=None):
        return self.layer(x)[0], None


def use_fla_mixers(model: nn.Module) -> nn.Module:
    for block in model.layers:
        block.attn = FlaMixer(model.config)
    return model


def run(config: dict, ctx: RunContext) -> dict:
    c = ThroughputConfig(**config["task"])
    device = ctx.device
    model = build_seeded_model(config["model"], int(config.get("seed", 0)))
    if c.impl == "fla":
        if model.config.family not in ("deltanet", "deltaproduct", "gated_deltanet", "gated_deltaproduct"):
            raise ValueError(f"task.impl: fla's GatedDeltaProduct stands in for delta-rule families only, "
                             f"not {model.config.family!r}")
        use_fla_mixers(model)
    mcfg = model.config.to_dict()
    n_params = num_params(model)
    budget_gib = c.memory_gb or (torch.cuda.get_device_properties(device).total_memory / budget.GIB
                                 if device.type == "cuda" else 0.0)
    mem = budget.check_memory(mcfg, n_params, c.batch_size, c.seq_len, budget_gib, key="task.seq_len")
    model.to(device).train()
    B, T, V = c.batch_size, c.seq_len, model.config.vocab_size
    gen = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, V, (B, T + 1), generator=gen).to(device)

    if c.scope == "layer":
        mixer = model.layers[0].attn
        x = torch.randn(B, T, model.config.hidden_size, device=device, generator=None, requires_grad=True)
        params = list(mixer.parameters())

        def step():
            with autocast(device, c.precision):
                y, _ = mixer(x)
            y.float().square().mean().backward()
            for p in params:
                p.grad = None
            x.grad = None
        flops = 6.0 * num_params(mixer) + 3.0 * budget.recurrence_flops_per_token(
            {**mcfg, "num_layers": 1})
    else:
        opt = make_optimizer(model, TrainConfig(lr=3e-4, weight_decay=0.01), device)

        def step():
            with autocast(device, c.precision):
                logits = model(ids[:, :-1])
            loss = F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        embed = model.embeddings.weight.numel()
        flops = budget.train_flops_per_token(mcfg, n_params - embed + (embed if getattr(model, "tied", True) else 0))

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for i in range(c.warmup_steps):
        step()
        ctx.report_progress((i + 1) / (c.warmup_steps + c.steps), "warm-up")
    sync()
    t0 = time.perf_counter()
    for i in range(c.steps):
        step()
        if ctx.should_stop():
            break
    sync()
    dt = time.perf_counter() - t0
    tps = B * T * c.steps / dt
    peak = budget.peak_tflops(torch.cuda.get_device_name(device) if device.type == "cuda" else "", c.peak_tflops)
    out = {TOKENS_PER_S: tps, "step_ms": 1000 * dt / c.steps, NUM_PARAMS: n_params, "seq_len": T,
           "batch_size": B, "mem_estimate_gib": mem, "num_heads": model.config.num_heads,
           "head_dim": model.config.key_dim, "hidden_size": model.config.hidden_size}
    if device.type == "cuda":
        out["peak_mem_gib"] = torch.cuda.max_memory_allocated(device) / budget.GIB
    if peak:
        out["mfu"] = tps * flops / (peak * 1e12)
    ctx.log_metrics(out, step=c.steps)
    ctx.report_progress(1.0, f"{tps:,.0f} tokens/s")
    return out
