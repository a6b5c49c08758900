"""In-trial entry point: `python -m dpx.orchestrator.runner RUN_DIR [--attempt N]`.

Reads RUN_DIR/config.json, runs the task, and writes result.json (completed) or error.json (failed / preempted).
Imports only the standard library and dpx.tasks (which pulls torch only if the task needs it): no pydantic,
omegaconf, mlflow, duckdb or ray, so a trial runs on a bare GPU node, and its run dir is ingested later.

Exit codes: 0 completed, 1 failed, 3 preempted (checkpoint written; the driver requeues it).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import socket
import sys
import time
import traceback
from pathlib import Path

from dpx.orchestrator import distributed, worker
from dpx.tasks import TASKS
from dpx.rundir import atomic_write_json
from dpx.tasks.context import Diverged, Preempted, RunContext

EXIT_OK, EXIT_FAILED, EXIT_PREEMPTED = 0, 1, 3


def run_trial(run_dir: Path, attempt: int = 1) -> int:
    run_dir = Path(run_dir)
    if not distributed.in_worker():  # first thing: a driver that lost our pid finds us by this (worker.py)
        worker.register(run_dir, attempt)
    config = json.loads((run_dir / "config.json").read_text())
    hw = config.get("hardware") or {}
    distributed.set_safe_env()  # NCCL_NVLS_ENABLE=0 etc. in this trial and everything it starts
    threads = hw.get("threads_per_trial") or max(1, int(hw.get("cpus_per_trial") or 1))
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    nproc = distributed.nproc_per_trial(hw)
    if nproc > 1 and not distributed.in_worker():  # data-parallel: torchrun re-runs this runner once per rank
        return distributed.launch(run_dir, attempt, nproc)
    if "torch" in sys.modules or config.get("model") is not None:
        import torch

        torch.set_num_threads(int(threads))
    device = hw.get("device") if hw.get("device") not in (None, "auto") else None
    if nproc > 1:  # a rank: process group up; ranks > 0 write to a scratch dir, rank 0 to the run dir
        distributed.die_with_parent()
        from dpx.tasks.training.distributed import worker_context

        ctx = worker_context(run_dir, config, attempt, device)
        run_dir = ctx.run_dir
    else:
        for stale in ("result.json", "error.json"):
            (run_dir / stale).unlink(missing_ok=True)
        ctx = RunContext(run_dir, config, attempt=attempt, device=device)
    ctx.install_signal_handlers()
    base = {"trial_id": config.get("trial_id", run_dir.name), "attempt": attempt, "host": socket.gethostname(),
            "pid": os.getpid(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    started = time.time()
    print(f"[dpx] trial {base['trial_id']} attempt {attempt} on {base['host']} (task {config['task']['name']})",
          flush=True)
    try:
        if config["task"]["name"] not in TASKS:  # a task a user package adds through an entry point
            from dpx.orchestrator.plugins import load as load_plugins

            load_plugins()
        spec = TASKS[config["task"]["name"]]
        metrics = spec.run_fn()(config, ctx) or {}
        bad = [k for k, v in metrics.items() if isinstance(v, (int, float)) and not math.isfinite(float(v))]
        if bad:
            raise Diverged(f"non-finite metric {bad[0]} = {metrics[bad[0]]}")
        atomic_write_json(run_dir / "result.json", {
            **base, "status": "completed", "metrics": metrics, "started_at": started, "ended_at": time.time(),
            "device": _device_name(ctx)})
        print(f"[dpx] completed: {json.dumps(metrics, default=str)[:500]}", flush=True)
        return EXIT_OK
    except Preempted as e:
        _write_error(run_dir, base, started, "preempted", f"preempted: {e}", "")
        print(f"[dpx] preempted, checkpoint saved: {e}", flush=True)
        return EXIT_PREEMPTED
    except BaseException as e:  # noqa: BLE001 — every failure ends in error.json with its one-line reason
        tb = traceback.format_exc()
        line = f"{type(e).__name__}: {e}".splitlines()[0][:500]
        if isinstance(e, OSError) and not e.filename:  # write/flush errors (disk full, quota) name no file
            line += f" (writing in {run_dir})"
        _write_error(run_dir, base, started, "failed", line, tb[-4000:])
        print(tb, file=sys.stderr, flush=True)
        return EXIT_FAILED
    finally:
        ctx.close()


def _write_error(run_dir: Path, base: dict, started: float, status: str, line: str, tb: str) -> None:
    atomic_write_json(run_dir / "error.json", {**base, "status": status, "error": line, "traceback": tb,
                                               "started_at": started, "ended_at": time.time()})


def _device_name(ctx: RunContext) -> str:
    if "torch" not in sys.modules:
        return "cpu"
    import torch

    if ctx.device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(ctx.device)
    return "cpu"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dpx.orchestrator.runner", description=__doc__)
    p.add_argument("run_dir", type=Path)
    p.add_argument("--attempt", type=int, default=int(os.environ.get("DPX_ATTEMPT", "1")))
    a = p.parse_args(argv)
    return run_trial(a.run_dir, a.attempt)


if __name__ == "__main__":
    sys.exit(main())
