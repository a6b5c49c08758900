"""The `debug` task: everything a real task does to the outside world (metrics, curves, progress, checkpoints,
failure modes) without a model, so orchestration can be tested and benchmarked for real in milliseconds."""
from __future__ import annotations

import json
import math
import os
import time

from dpx.tasks.context import Diverged, Preempted, RunContext
from dpx.tasks.debug.config import DebugConfig


def run(config: dict, ctx: RunContext) -> dict:
    c = DebugConfig(**config["task"])  # the defaults are DebugConfig's
    steps, sleep_s = c.steps, c.sleep_s
    start = 0
    ck = ctx.checkpoint_dir / "last.json"
    if c.checkpoint and ck.exists():
        start = json.loads(ck.read_text())["step"]
    for step in range(start, steps):
        if ctx.should_stop():
            raise Preempted(f"stopped at step {step}")
        if sleep_s:
            time.sleep(sleep_s / max(steps, 1))
        loss = math.nan if step == c.nan_at_step else 1.0 / (step + 1)
        ctx.log_metrics({"loss": loss}, step=step)
        if not math.isfinite(loss):
            raise Diverged(f"loss is {loss} at step {step}")
        if c.checkpoint:
            ck.write_text(json.dumps({"step": step + 1}))
        ctx.report_progress((step + 1) / max(steps, 1), f"step {step + 1}/{steps}")
    if steps == 0 and sleep_s:
        time.sleep(sleep_s)
    ctx.log_curve("curve/acc_vs_pos", range(1, 5), [1.0, 0.9, 0.5, 0.1])
    if c.exit_code:
        os._exit(c.exit_code)
    if c.fail or ctx.attempt <= c.fail_on_attempts:
        raise RuntimeError(f"injected failure (attempt {ctx.attempt})")
    return {"score": c.value, "steps": steps, "resumed_from": start}
