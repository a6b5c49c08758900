"""tasks/lm training task and throughput task, for real on tiny shapes: the paper's protocol wiring, exact resume
after preemption, refusals before training (vocab, memory, offline hub), checkpoint-only evaluation, throughput."""
from __future__ import annotations

import json
import math

import pytest
import torch

from dpx.tasks import TASKS
from dpx.tasks.context import Preempted, RunContext
from dpx.tasks.lm.sources import DatasetUnavailable

MODEL = {"family": "deltaproduct", "hidden_size": 32, "num_layers": 1, "num_heads": 2, "head_dim": 8,
         "num_householder": 2, "beta_range": [-1, 1], "vocab_size": 32000}


def config(**task):
    t = {"name": "lm", "dataset": "botchan", "context_len": 16, "tokens_per_step": 64, "micro_batch_size": 2,
         "val_fraction": 0.05, "val_sequences": 2, "shuffle_buffer": 8}
    t.update(task)
    return {"seed": 3, "model": dict(MODEL), "task": t,
            "train": {"steps": 6, "lr": 3e-3, "warmup_steps": 2, "log_every": 1, "eval_every": 3,
                      "checkpoint_every": 2}}


def run(cfg, run_dir, ctx_cls=RunContext):
    spec = TASKS[cfg["task"]["name"]]
    spec.config_cls()(**cfg["task"])  # what the orchestrator validates
    ctx = ctx_cls(run_dir, cfg, device="cpu")
    try:
        return spec.run_fn()(cfg, ctx)
    finally:
        ctx.close()


def metrics(run_dir, key):
    rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["value"]) for r in rows if r["key"] == key]


def test_lm_task_trains_with_the_papers_protocol(tmp_path):
    out = run(config(), tmp_path / "a")
    # tokens_per_step 64 / context 16 = 4 sequences per step, 2 micro-batches of 2
    assert out["train_steps"] == 6 and out["train_tokens"] == 6 * 64
    assert out["num_params"] > 32000 * 32 and math.isfinite(out["val_loss"]) and out["tokens_per_s"] > 0
    assert out["val_ppl"] == pytest.approx(math.exp(out["val_loss"]), rel=1e-6)
    assert dict(metrics(tmp_path / "a", "train/grad_accum"))[0] == 2
    lrs = [v for _, v in metrics(tmp_path / "a", "train/lr")]
    assert lrs[0] == pytest.approx(3e-3 / 2) and lrs[1] == pytest.approx(3e-3)  # linear warm-up over 2 steps
    assert lrs[-1] < lrs[2]  # then cosine decay
    assert (tmp_path / "a" / "checkpoints" / "model" / "model.safetensors").exists()


class StopBeforeStep4(RunContext):
    """Acts like SIGTERM arriving before the 4th optimizer step."""
    polls = 0

    def should_stop(self) -> bool:
        StopBeforeStep4.polls += 1
        return StopBeforeStep4.polls == 4


def test_preempted_run_resumes_bit_identically(tmp_path):
    cfg = config()
    full = run(cfg, tmp_path / "full")
    with pytest.raises(Preempted):
        run(cfg, tmp_path / "resumed", StopBeforeStep4)
    assert [s for s, _ in metrics(tmp_path / "resumed", "train/loss")] == [1, 2, 3]
    resumed = run(cfg, tmp_path / "resumed")  # a new attempt in the same run dir continues from last.pt
    assert resumed["train_steps"] == 6
    assert metrics(tmp_path / "resumed", "train/loss")[-3:] == metrics(tmp_path / "full", "train/loss")[-3:]
    assert resumed["val_loss"] == full["val_loss"]
    from safetensors.torch import load_file
    a = load_file(str(tmp_path / "full" / "checkpoints" / "model" / "model.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "checkpoints" / "model" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_refusals_happen_before_training(tmp_path, monkeypatch):
    cfg = config(tokenizer="byte")
    with pytest.raises(ValueError, match=r"^model.vocab_size: 32000 does not match tokenizer byte"):
        run(cfg, tmp_path / "vocab")
    with pytest.raises(ValueError, match=r"^task.context_len: 16 tokens x micro-batch 2 needs about .* GiB"):
        run(config(memory_gb=1e-4), tmp_path / "mem")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(DatasetUnavailable, match="codeparrot/codeparrot-train-v2-near-dedup"):
        run(config(dataset="codeparrot"), tmp_path / "hub")
    for d in ("vocab", "mem", "hub"):
        assert not metrics(tmp_path / d, "train/loss")


def test_byte_tokenizer_model_and_checkpoint_only_evaluation(tmp_path):
    cfg = config(tokenizer="byte")
    cfg["model"]["vocab_size"] = 259
    cfg["train"].update(steps=3, eval_every=0)
    run(cfg, tmp_path / "train")
    ev = config(name="extrapolation", tokenizer="byte", checkpoint=str(tmp_path / "train"),
                extrapolation={"datasets": ["math_synth"], "max_len": 64, "num_sequences": 2, "window": 9})
    ev["model"]["vocab_size"] = 259
    out = run(ev, tmp_path / "eval")
    curve = metrics(tmp_path / "eval", "loss_at_pos/math_synth")
    assert [s for s, _ in curve] == list(range(1, 64))
    assert out["loss_in_ctx"] == pytest.approx(sum(v for _, v in curve[:16]) / 16)
    assert out["loss_beyond_ctx"] == pytest.approx(sum(v for _, v in curve[16:]) / 47)
    assert (tmp_path / "eval" / "figures" / "extrapolation.png").exists()
    assert not metrics(tmp_path / "eval", "train/loss")  # no training with a checkpoint


def test_effective_rank_task_logs_every_head(tmp_path):
    cfg = config(evals=["effective_rank"], effective_rank={"dataset": "chatterbot_qa", "seq_len": 40, "stride": 2})
    cfg["model"].update(family="gated_deltaproduct", num_layers=2)
    cfg["train"].update(steps=2, eval_every=0)
    out = run(cfg, tmp_path / "r")
    for l in (0, 1):
        for h in (0, 1):
            curve = metrics(tmp_path / "r", f"erank/l{l}/h{h}")
            assert [s for s, _ in curve] == list(range(2, 41, 2))
            assert all(0 < v <= 8 for _, v in curve)  # a nonzero 8x8 state has erank in [1, 8]
        assert math.isfinite(out[f"erank_in_ctx/l{l}"])
    assert (tmp_path / "r" / "figures" / "effective_rank.png").exists()


def test_throughput_task(tmp_path):
    cfg = {"seed": 0, "model": dict(MODEL),
           "task": {"name": "throughput", "seq_len": 32, "batch_size": 2, "warmup_steps": 1, "steps": 2}}
    out = run(cfg, tmp_path / "t")
    assert out["tokens_per_s"] > 0 and out["seq_len"] == 32 and out["batch_size"] == 2
    assert out["step_ms"] == pytest.approx(32 * 2 / out["tokens_per_s"] * 1000, rel=1e-6)
    layer = run({**cfg, "task": {**cfg["task"], "scope": "layer"}}, tmp_path / "l")
    assert layer["tokens_per_s"] > 0
    with pytest.raises(ValueError, match=r"^task.seq_len: "):
        run({**cfg, "task": {**cfg["task"], "memory_gb": 1e-5}}, tmp_path / "m")


def test_fla_impl_needs_fla(tmp_path):
    try:
        import fla.layers  # noqa: F401
        pytest.skip("fla is installed here")
    except ImportError:
        pass
    cfg = {"seed": 0, "model": dict(MODEL), "task": {"name": "throughput", "seq_len": 16, "batch_size": 1,
                                                     "impl": "fla"}}
    with pytest.raises(RuntimeError, match="task.impl: fla"):
        run(cfg, tmp_path / "f")
