"""Data-parallel training, rank side: helpers the shared loop calls, no-ops unless a process group is up.

torchrun starts one runner per rank (orchestrator/trial/ranks.py); `worker_context` brings the process group up
(NCCL on GPUs, gloo on CPU), pins the rank's GPU and returns the rank's RunContext. In the loop:

- rank 0 alone calls `batch_fn(step, micro)` and scatters 1/world of dim 0 to each rank (`next_shard`): one data
  pipeline (tokenisation) feeds every rank, and the global batch, its order and the saved data position are a
  single process's, so the recipe's `batch_size` holds whatever the world size and resume stays exact;
- the model is wrapped in DistributedDataParallel (`wrap`); gradients are averaged, so a step equals a
  single-process step on the global batch;
- the logged loss is the mean over ranks and tokens the sum (`reduce_step`); stop decisions (SIGTERM, time limit)
  are agreed by all ranks (`any_rank`), since a rank that stops alone would hang the others in a collective;
  validation results are rank 0's (`broadcast`), so early stopping agrees too;
- rank 0 alone writes the run dir (`is_main`): other ranks get a RunContext on a scratch dir that resumes from rank
  0's checkpoint.
"""
from __future__ import annotations

import contextlib
import datetime
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from dpx.rundir import CHECKPOINTS
from dpx.tasks.context import LAST_CHECKPOINT, RunContext


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if active() else 0


def world_size() -> int:
    return dist.get_world_size() if active() else 1


def is_main() -> bool:
    return rank() == 0


def wrap(model: nn.Module) -> nn.Module:
    """DistributedDataParallel around `model` (already on its device) when distributed, else `model`."""
    if not active():
        return model
    dev = next(model.parameters()).device
    return DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None)


def no_sync(model: nn.Module, skip: bool):
    """DDP's no_sync (no gradient all-reduce) for the micro-batches before the last of an accumulated step."""
    ddp = getattr(model, "_orig_mod", model)  # through torch.compile's wrapper
    if skip and hasattr(ddp, "no_sync"):
        return ddp.no_sync()
    return contextlib.nullcontext()


def _slice(batch: Any, r: int, w: int) -> Any:
    """Rank r's slice of dim 0 of every tensor in a (nested) batch; the batch must divide evenly."""
    if torch.is_tensor(batch):
        if batch.ndim == 0 or batch.shape[0] % w:
            raise ValueError(f"hardware: a micro-batch of {batch.shape[0] if batch.ndim else 0} sequences does not "
                             f"split over {w} data-parallel processes (make the micro-batch a multiple of {w})")
        n = batch.shape[0] // w
        return batch[r * n:(r + 1) * n]
    if isinstance(batch, dict):
        return {k: _slice(v, r, w) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_slice(v, r, w) for v in batch)
    return batch


def next_shard(batch_fn: Callable[[int, int], Any], step: int, micro: int) -> Any:
    """This rank's part of the micro-batch `batch_fn(step, micro)` (the whole of it when not distributed). Rank 0
    makes the batch and scatters the slices; an error there is raised on every rank, so none waits forever."""
    if not active():
        return batch_fn(step, micro)
    w, parts = world_size(), None
    if is_main():
        try:
            b = batch_fn(step, micro)
            parts = [_slice(b, r, w) for r in range(w)]
        except Exception as e:  # noqa: BLE001 — handed to every rank, which raises it
            parts = [e] * w
    out: list = [None]
    dist.scatter_object_list(out, parts, src=0)
    if isinstance(out[0], Exception):
        raise out[0]
    return out[0]


def _device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def reduce_step(loss_sum: torch.Tensor, tokens: int) -> tuple[torch.Tensor, int]:
    """(mean of loss_sum over ranks, sum of tokens over ranks); one all-reduce."""
    if not active():
        return loss_sum, tokens
    t = torch.stack([loss_sum.detach().double().to(_device()), torch.tensor(float(tokens), dtype=torch.float64,
                                                                            device=_device())])
    dist.all_reduce(t)  # SUM: gloo has no AVG
    return (t[0] / world_size()).to(loss_sum.dtype), int(round(t[1].item()))


def any_rank(flag: bool) -> bool:
    """True on every rank when it is true on any rank."""
    if not active():
        return bool(flag)
    t = torch.tensor([1.0 if flag else 0.0], device=_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def broadcast(obj: Any) -> Any:
    """Rank 0's `obj` on every rank."""
    if not active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class RankContext(RunContext):
    """A rank's RunContext: rank 0 writes the run dir as usual; other ranks write to a scratch dir (removed on
    close) and resume from rank 0's checkpoint. close() also takes the process group down."""

    def __init__(self, run_dir, config: dict, attempt: int, device: str, rank: int):
        self.main_run_dir = Path(run_dir)
        self.rank = rank
        here = self.main_run_dir if rank == 0 else Path(tempfile.mkdtemp(prefix=f"dpx_rank{rank}_"))
        super().__init__(here, config, attempt=attempt, device=device)
        self.trial_id = config.get("trial_id", self.main_run_dir.name)

    def resume_path(self) -> Path | None:
        p = self.main_run_dir / CHECKPOINTS / LAST_CHECKPOINT
        return p if p.exists() else None

    def close(self) -> None:
        super().close()
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        if self.rank != 0:
            shutil.rmtree(self.run_dir, ignore_errors=True)


def worker_context(run_dir, config: dict, attempt: int, device: str | None) -> RankContext:
    """In a torchrun rank: init the process group (NCCL when the trial runs on CUDA, else gloo), pin
    cuda:LOCAL_RANK, split the trial's CPU threads over the ranks, and return this rank's RankContext."""
    local_rank, world = int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    use_cuda = device != "cpu" and torch.cuda.is_available()
    if device == "cuda" and not use_cuda:
        raise RuntimeError("hardware.device: cuda asked for, but this rank sees no GPU")
    if use_cuda:
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(f"hardware.gpus_per_trial: rank {local_rank} has no GPU (this trial sees "
                               f"{torch.cuda.device_count()}: CUDA_VISIBLE_DEVICES="
                               f"{os.environ.get('CUDA_VISIBLE_DEVICES')})")
        torch.cuda.set_device(local_rank)
        dev = f"cuda:{local_rank}"
        dist.init_process_group("nccl", device_id=torch.device(dev), timeout=datetime.timedelta(minutes=30))
    else:
        dev = "cpu"
        dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=30))
    torch.set_num_threads(max(1, torch.get_num_threads() // world))
    return RankContext(run_dir, config, attempt, dev, dist.get_rank())
