"""The `lm` task (and `lm_eval`, `extrapolation`, `effective_rank`): train a language model with the paper's
protocol through the shared loop, then run the evaluations the config names.

Order of work, so that bad input fails before any compute: config -> tokenizer/vocab check -> text source
(a hub data set that cannot be reached fails here, in one line) -> model -> memory check of the context length
-> training (resumable: model, optimizer, schedule, RNG and the data stream's position) -> evaluations.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from dpx.models import num_params
from dpx.rundir import NUM_PARAMS, TOKENS_PER_S, VAL_LOSS
from dpx.tasks.context import RunContext
from dpx.tasks.training.config import TrainConfig
from dpx.tasks.training.loop import autocast, fit
from dpx.tasks.training.setup import TrialSetup, next_token_loss, setup_trial

from . import budget, effective_rank, extrapolation, lm_eval_adapter
from .config import LMConfig
from .packing import PackedStream, Prefetcher, take_sequences
from .saved import MODEL_DIR, load_model
from .sources import open_source
from .tokenizer import load_tokenizer


def run(config: dict, ctx: RunContext) -> dict:
    # typed sections + LMConfig.check_model (tokenizer vs vocab) before any data work; the model is built
    # once the text source has opened (an unreachable dataset fails first, in one line)
    s = setup_trial(config, ctx, LMConfig, train=lambda c: resolve_train(c, config.get("train") or {}),
                    build=False)
    cfg, seed, device = s.task, s.seed, s.device
    tok = load_tokenizer(cfg.tokenizer)

    if cfg.checkpoint:
        model = load_model(cfg.checkpoint, device)
        summary: dict = {NUM_PARAMS: num_params(model)}
    else:
        model, summary = train(s, tok, ctx)
    model.to(device).eval()
    return {**summary, **run_evals(model, tok, cfg, ctx, seed)}


def resolve_train(cfg: LMConfig, train: dict) -> TrainConfig:
    """tokens_per_step -> batch_size; micro_batch_size -> grad_accum (the paper: 524,288 tokens per step)."""
    t = dict(train)
    if cfg.tokens_per_step:
        t["batch_size"] = cfg.tokens_per_step // cfg.context_len
    bs = t.get("batch_size", TrainConfig.batch_size)
    if cfg.micro_batch_size:
        if bs % cfg.micro_batch_size:
            raise ValueError(f"task.micro_batch_size: {cfg.micro_batch_size} does not divide the batch of {bs} "
                             "sequences")
        t["grad_accum"] = bs // cfg.micro_batch_size
    return TrainConfig(**t)


def train(s: TrialSetup, tok, ctx: RunContext):
    cfg, tc, seed = s.task, s.train, s.seed
    micro = tc.batch_size // tc.grad_accum
    src_kw = dict(data_files=cfg.data_files, text_format=cfg.text_format, seed=seed, val_fraction=cfg.val_fraction,
                  val_seed=cfg.val_seed, val_docs=cfg.val_docs, max_docs=cfg.max_docs)
    train_src = open_source(cfg.dataset, "train", **src_kw)
    # input = seq[:-1], target = seq[1:]: context_len + 1 tokens cut every context_len tokens
    stream = PackedStream(train_src, tok, cfg.context_len + 1, stride=cfg.context_len, seed=seed,
                          shuffle_buffer=cfg.shuffle_buffer)
    val = take_sequences(open_source(cfg.dataset, "validation", **src_kw), tok, cfg.context_len + 1,
                         cfg.val_sequences, stride=cfg.context_len)
    if len(val) == 0:
        raise ValueError(f"task.val_fraction: the validation split of {cfg.dataset} holds fewer than "
                         f"{cfg.context_len + 1} tokens; raise val_fraction (or val_docs for a hub stream)")

    model = s.build_model()
    mcfg = model.config.to_dict() if hasattr(model.config, "to_dict") else dict(s.config["model"])
    n_params = num_params(model)
    device = ctx.device
    budget_gib = cfg.memory_gb or (torch.cuda.get_device_properties(device).total_memory / budget.GIB
                                   if device.type == "cuda" else 0.0)
    mem = budget.check_memory(mcfg, n_params, micro, cfg.context_len, budget_gib)
    embed = model.embeddings.weight.numel()
    # the tied head is a matmul (counted once); the embedding lookup is not
    matmul_params = n_params - embed + (embed if getattr(model, "tied", True) else 0)
    fpt = budget.train_flops_per_token(mcfg, matmul_params)
    peak = budget.peak_tflops(torch.cuda.get_device_name(device) if device.type == "cuda" else "", cfg.peak_tflops)
    ctx.log_metrics({NUM_PARAMS: n_params, "train/flops_per_token": fpt, "train/mem_estimate_gib": mem,
                     "train/batch_size": tc.batch_size, "train/grad_accum": tc.grad_accum}, step=0)
    print(f"[dpx] lm: {n_params / 1e6:.2f}M parameters, {tc.batch_size} x {cfg.context_len} tokens per step "
          f"({tc.grad_accum} micro-batches of {micro}), memory estimate {mem:.2f} GiB", flush=True)

    feed = Prefetcher(stream, micro)  # tokenises ahead in a thread; its state is that of the batches handed out

    def batch_fn(step: int, micro_idx: int):
        b = torch.from_numpy(feed.next_batch().astype(np.int64))
        return b[:, :-1], b[:, 1:]

    val_t = torch.from_numpy(val.astype(np.int64))

    def eval_fn(m):
        loss = sequence_loss(m, val_t, micro, ctx.device)
        return {"val/loss": loss, "val/ppl": math.exp(min(loss, 50.0))}

    try:
        res = fit(model, tc, _MFUContext(ctx, fpt, peak), batch_fn=batch_fn, loss_fn=next_token_loss(), eval_fn=eval_fn,
                  data_state=feed)
    finally:
        feed.close()
    if cfg.save_model and hasattr(model, "save_pretrained"):
        model.save_pretrained(ctx.checkpoint_dir / MODEL_DIR)
    summary = {NUM_PARAMS: n_params, "num_heads": model.config.num_heads, "head_dim": model.config.key_dim,
               "hidden_size": model.config.hidden_size, TOKENS_PER_S: res.tokens_per_s, "train_tokens": res.tokens,
               "train_steps": res.step, "train_time_s": res.train_time_s,
               "train_first_steps_s": res.first_steps_s, "tokens_per_s_overall": res.tokens_per_s_overall,
               VAL_LOSS: res.last_eval.get("val/loss"), "val_ppl": res.last_eval.get("val/ppl")}
    if peak:
        summary["mfu"] = res.tokens_per_s * fpt / (peak * 1e12)
    return model, {k: v for k, v in summary.items() if v is not None}


@torch.no_grad()
def sequence_loss(model, seqs: torch.Tensor, batch_size: int, device) -> float:
    """Mean next-token loss (nats) over [N, T+1] sequences."""
    total, count = 0.0, 0
    for i in range(0, len(seqs), batch_size):
        b = seqs[i:i + batch_size].to(device)
        with autocast(device):
            logits = model(b[:, :-1])
        total += F.cross_entropy(logits.float().flatten(0, 1), b[:, 1:].flatten(), reduction="sum").item()
        count += b[:, 1:].numel()
    return total / max(count, 1)


class _MFUContext:
    """The trial's RunContext, with train/mfu added wherever the loop logs train/tokens_per_s."""

    def __init__(self, ctx: RunContext, flops_per_token: float, peak_tflops: float):
        self._ctx, self._fpt, self._peak = ctx, flops_per_token, peak_tflops

    def __getattr__(self, name):
        return getattr(self._ctx, name)

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        if self._peak and "train/tokens_per_s" in metrics:
            metrics = {**metrics, "train/mfu": metrics["train/tokens_per_s"] * self._fpt / (self._peak * 1e12)}
        self._ctx.log_metrics(metrics, step)


def run_evals(model, tok, cfg: LMConfig, ctx: RunContext, seed: int) -> dict:
    out: dict = {}
    for name in cfg.evals:
        ctx.report_progress(1.0, f"evaluating: {name}")
        if name == "lm_eval":
            out.update(lm_eval_adapter.evaluate(model, tok, cfg.lm_eval, ctx, context_len=cfg.context_len))
        elif name == "extrapolation":
            out.update(extrapolation.evaluate(model, tok, cfg.extrapolation, ctx, train_context=cfg.context_len, seed=seed))
        elif name == "effective_rank":
            out.update(effective_rank.evaluate(model, tok, cfg.effective_rank, ctx, train_context=cfg.context_len))
    return out
