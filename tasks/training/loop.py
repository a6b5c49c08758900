"""The training loop every training task shares (word problems, formal languages, language modelling).

`fit(model, train_cfg, ctx, batch_fn=..., loss_fn=..., eval_fn=...)` runs AdamW with warm-up + cosine/linear/
constant decay, gradient clipping, gradient accumulation, bf16 autocast on CUDA (fp32 on CPU), periodic validation
with early stopping, periodic checkpoints to `ctx.checkpoint_dir / "last.pt"` and exact resume from it.

Exact resume rests on one rule: **the data position is the step**. `batch_fn(step, micro)` must return the same
batch for the same arguments (synthetic tasks derive it from a seed; a streaming data set can additionally pass a
`data_state` object with `state_dict()` / `load_state_dict()`, saved in the checkpoint). Model, optimizer,
scheduler, step, token count, training time and every RNG are saved too, so an interrupted-and-resumed run takes
bit-identical steps to an uninterrupted one on the same device.

Preemption: `ctx.should_stop()` is polled before every step; when set (SIGTERM/SIGUSR1 via the runner's signal
handlers) the loop writes a checkpoint and raises `Preempted`. A NaN/Inf loss or gradient norm raises `Diverged`
naming the step.
"""
from __future__ import annotations

import contextlib
import math
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np
import torch
from torch import nn

from dpx.models.compile import compile_model
from dpx.tasks.context import LAST_CHECKPOINT, Diverged, Preempted
from dpx.tasks.training import distributed as dd
from dpx.tasks.training.config import TrainConfig
from dpx.tasks.training.schedule import lr_factor

CHECKPOINT_VERSION = 1


class Stateful(Protocol):
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...


@dataclass
class FitResult:
    step: int
    """optimizer steps done in total (over all attempts)"""
    stop_reason: str
    """steps | early_stop | time_limit"""
    train_time_s: float
    """seconds spent in training steps (no evaluation, no checkpointing), over all attempts"""
    tokens: int
    """training tokens consumed (as counted by loss_fn)"""
    tokens_per_s: float
    """tokens / train_time_s without each attempt's first step (see steady_rate), or with it when that is all"""
    last_eval: dict = field(default_factory=dict)
    resumed_from: int = 0
    """step of the checkpoint this attempt started from (0: fresh)"""
    first_steps_s: float = 0.0
    """seconds of each attempt's first step (compilation and autotuning on a GPU), over all attempts"""
    tokens_per_s_overall: float = 0.0
    """tokens / train_time_s, first steps included"""

    def summary(self, prefix: str = "train/") -> dict[str, float]:
        return {f"{prefix}steps": self.step, f"{prefix}time_s": round(self.train_time_s, 3),
                f"{prefix}tokens": self.tokens, f"{prefix}tokens_per_s": round(self.tokens_per_s, 1),
                f"{prefix}tokens_per_s_overall": round(self.tokens_per_s_overall, 1),
                f"{prefix}first_steps_s": round(self.first_steps_s, 3),
                f"{prefix}early_stopped": float(self.stop_reason == "early_stop")}


def steady_rate(tokens: int, time_s: float, first_tokens: int, first_s: float) -> float:
    """Tokens/s without the first step of each attempt, which on a GPU compiles and autotunes every kernel: in
    table3's gpu_small trials on the H200 (60 steps, 2026-12-01) the first 10 steps ran at 12-22k tokens/s and the
    rest at 0.6-0.7M, so a rate that kept them ranked DeltaNet below DeltaProduct_2 (it ran first, on a cold
    compile cache), the opposite of their steady rates. Falls back to all steps when nothing follows a first step."""
    if tokens > first_tokens and time_s > first_s:
        return (tokens - first_tokens) / (time_s - first_s)
    return tokens / max(time_s, 1e-9)


def autocast(device: torch.device, precision: str = "auto"):
    """bf16 autocast on CUDA for `auto`/`bf16`, on CPU only for `bf16`; otherwise a no-op context."""
    if precision == "fp32" or (precision == "auto" and device.type != "cuda"):
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def to_device(batch: Any, device: torch.device) -> Any:
    if torch.is_tensor(batch):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def decays(p: torch.Tensor) -> bool:
    """Whether AdamW's weight decay applies to `p`: matrices decay, vectors (biases, norm gains) do not (nanoGPT's
    split), and neither does any parameter its layer marks `_no_weight_decay` whatever its rank (Mamba's A_log,
    RWKV's decays, bonuses and token-shift mixes: mamba_ssm marks A_log and D so, and RWKV-LM's trainer decays
    only `.weight` matrices, so its decays, bonuses and mixes never decay)."""
    return p.ndim >= 2 and not getattr(p, "_no_weight_decay", False)


def make_optimizer(model: nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with two groups: `decays(p)` at cfg.weight_decay, the rest at 0."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if decays(p)], "weight_decay": cfg.weight_decay},
              {"params": [p for p in params if not decays(p)], "weight_decay": 0.0}]
    extra = {"fused": True} if device.type == "cuda" else {}
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), **extra)


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    # RNG states are CPU byte tensors whatever device the checkpoint was loaded onto (fit loads it with
    # map_location=device: on a GPU that moved them to CUDA, and every resumed GPU trial died here with "RNG state
    # must be a torch.ByteTensor", H200 2026-12-01)
    torch.set_rng_state(state["torch"].cpu())
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([x.cpu() for x in state["cuda"]])


def save_checkpoint(path: Path, obj: dict) -> None:
    """torch.save to a temp file, then rename: a kill mid-write never leaves a broken last.pt."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def fit(model: nn.Module, cfg: TrainConfig | dict, ctx, *,
        batch_fn: Callable[[int, int], Any],
        loss_fn: Callable[[nn.Module, Any], tuple[torch.Tensor, int]],
        eval_fn: Callable[[nn.Module], dict[str, float]] | None = None,
        data_state: Stateful | None = None) -> FitResult:
    """Train `model` in place (moved to `ctx.device`) and return what happened.

    batch_fn(step, micro): the micro-batch `micro` (0..grad_accum-1) of optimizer step `step` (0-based), any
      nesting of tensors (moved to the device here); deterministic in its arguments.
    loss_fn(model, batch) -> (mean loss, tokens in the batch); runs under autocast.
    eval_fn(model) -> {"val/...": value}; runs under no_grad + autocast with model.eval(), every
      `eval_every` steps and once at the end; `early_stop_metric` names one of its keys.
    """
    if isinstance(cfg, dict):
        cfg = TrainConfig(**cfg)
    device = ctx.device
    model.to(device)
    opt = make_optimizer(model, cfg, device)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(
        s, steps=cfg.steps, warmup_steps=cfg.warmup_steps, schedule=cfg.schedule, min_lr_ratio=cfg.min_lr_ratio))
    ck_path = ctx.checkpoint_dir / LAST_CHECKPOINT

    step, tokens, train_time, last_eval, stop_reason, finished = 0, 0, 0.0, {}, "steps", False
    first_s, first_tokens = 0.0, 0  # each attempt's first step (compile + autotune), summed: steady_rate
    resume = ctx.resume_path()
    if resume is not None:
        ck = torch.load(resume, map_location=device, weights_only=False)
        if ck.get("version") != CHECKPOINT_VERSION:
            raise RuntimeError(f"checkpoint {resume} has version {ck.get('version')}, expected {CHECKPOINT_VERSION}")
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        sched.load_state_dict(ck["scheduler"])
        _set_rng_state(ck["rng"])
        if data_state is not None and ck.get("data_state") is not None:
            data_state.load_state_dict(ck["data_state"])
        step, tokens, train_time = ck["step"], ck["tokens"], ck["train_time_s"]
        first_s, first_tokens = ck.get("first_steps_s", 0.0), ck.get("first_steps_tokens", 0)
        last_eval, stop_reason, finished = ck["last_eval"], ck["stop_reason"], ck["finished"]
        print(f"[dpx] resumed from {resume} at step {step}" + (" (training already finished)" if finished else ""),
              flush=True)
    resumed_from = step

    def checkpoint(done: bool = False) -> None:
        if not dd.is_main():  # data-parallel: rank 0 alone writes (the ranks' states are identical)
            return
        save_checkpoint(ck_path, {
            "version": CHECKPOINT_VERSION, "step": step, "tokens": tokens, "train_time_s": train_time,
            "first_steps_s": first_s, "first_steps_tokens": first_tokens,
            "model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
            "rng": _rng_state(), "data_state": data_state.state_dict() if data_state is not None else None,
            "last_eval": last_eval, "stop_reason": stop_reason, "finished": done, "train_config": asdict(cfg)})

    def evaluate() -> dict:
        model.eval()
        try:
            with torch.no_grad(), autocast(device, cfg.precision):
                out = dd.broadcast({k: float(v) for k, v in eval_fn(model).items()})  # rank 0's, so ranks agree
        finally:
            model.train()
        ctx.log_metrics(out, step=step)
        return out

    def early_stop(ev: dict) -> bool:
        if not cfg.early_stop_metric:
            return False
        if cfg.early_stop_metric not in ev:
            raise KeyError(f"train.early_stop_metric: {cfg.early_stop_metric!r} is not among the validation "
                           f"metrics {sorted(ev)}")
        v = ev[cfg.early_stop_metric]
        return v >= cfg.early_stop_value if cfg.early_stop_mode == "max" else v <= cfg.early_stop_value

    def result() -> FitResult:
        return FitResult(step, stop_reason, train_time, tokens, steady_rate(tokens, train_time, first_tokens, first_s),
                         last_eval, resumed_from, first_s, tokens / max(train_time, 1e-9))

    if finished:
        return result()

    if cfg.compile and cfg.compile_scope == "blocks":  # in place, before DDP: parameter names stay as they are
        compile_model(model, "blocks")
    train_model = dd.wrap(model)  # DistributedDataParallel when the trial runs as several ranks
    if cfg.compile and cfg.compile_scope == "model":
        train_model = compile_model(train_model, "model")
    params = [p for p in model.parameters() if p.requires_grad]
    model.train()
    win_tokens, win_time, evaluated_at = 0, 0.0, -1
    while step < cfg.steps:
        if dd.any_rank(ctx.should_stop()):  # every rank stops at the same step (or the others hang)
            checkpoint()
            raise Preempted(f"stop requested; checkpoint saved at step {step}")
        # the time box leaves out each attempt's first step (compile + autotune: 13-31 s for the delta kernels on the
        # H200 with trials sharing it, against 1-3 s for a Transformer), so architectures get the same training time
        if cfg.max_time_s and dd.any_rank(train_time - first_s >= cfg.max_time_s):
            stop_reason = "time_limit"
            break
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_sum, step_tokens = torch.zeros((), device=device), 0
        for micro in range(cfg.grad_accum):
            batch = to_device(dd.next_shard(batch_fn, step, micro), device)  # this rank's slice of the micro-batch
            with dd.no_sync(train_model, micro < cfg.grad_accum - 1):  # DDP: all-reduce after the last micro
                with autocast(device, cfg.precision):
                    loss, ntok = loss_fn(train_model, batch)
                (loss / cfg.grad_accum).backward()
            loss_sum += loss.detach().float()
            step_tokens += int(ntok)
        loss_sum, step_tokens = dd.reduce_step(loss_sum, step_tokens)  # mean loss, all tokens over the ranks
        loss_val = loss_sum.item() / cfg.grad_accum
        gnorm = float(nn.utils.clip_grad_norm_(params, cfg.grad_clip if cfg.grad_clip > 0 else math.inf))
        if not (math.isfinite(loss_val) and math.isfinite(gnorm)):
            ctx.log_metrics({"train/loss": loss_val, "train/grad_norm": gnorm}, step=step + 1)
            what = "loss" if not math.isfinite(loss_val) else "gradient norm"
            raise Diverged(f"training {what} is {loss_val if what == 'loss' else gnorm} at step {step + 1}")
        lr = opt.param_groups[0]["lr"]
        opt.step()
        sched.step()
        step += 1
        dt = time.perf_counter() - t0
        if step == resumed_from + 1:  # this attempt's first step
            first_s, first_tokens = first_s + dt, first_tokens + step_tokens
        train_time += dt
        tokens += step_tokens
        win_tokens += step_tokens
        win_time += dt

        if step % max(cfg.log_every, 1) == 0 or step == cfg.steps:
            ctx.log_metrics({"train/loss": loss_val, "train/lr": lr, "train/grad_norm": gnorm,
                             "train/tokens_per_s": win_tokens / max(win_time, 1e-9), "train/tokens": tokens},
                            step=step)
            win_tokens, win_time = 0, 0.0
            ctx.report_progress(step / cfg.steps, f"step {step}/{cfg.steps} loss {loss_val:.4f}")
        if eval_fn is not None and cfg.eval_every and step % cfg.eval_every == 0:
            last_eval, evaluated_at = evaluate(), step
            if early_stop(last_eval):
                stop_reason = "early_stop"
                break
        if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and step < cfg.steps:
            checkpoint()

    if eval_fn is not None and evaluated_at != step:
        last_eval = evaluate()
    checkpoint(done=True)
    ctx.report_progress(1.0, f"trained {step} steps ({stop_reason})")
    return result()
