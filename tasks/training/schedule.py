"""Learning-rate schedules as a multiplier of the peak lr (what `torch.optim.lr_scheduler.LambdaLR` wants).

Linear warm-up from 0 over `warmup_steps`, then `cosine` (to `min_lr_ratio`), `linear` (to `min_lr_ratio`) or
`constant` decay over the remaining steps. Pure Python so it can be tested against the formula directly.
"""
from __future__ import annotations

import math


def lr_factor(step: int, *, steps: int, warmup_steps: int, schedule: str, min_lr_ratio: float) -> float:
    """Multiplier of the peak lr used for the optimizer update that ends step `step` (0-based)."""
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps  # never exactly 0, so the first update does something
    if schedule == "constant":
        return 1.0
    decay_steps = max(1, steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    if schedule == "cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    elif schedule == "linear":
        shape = 1.0 - progress
    else:
        raise ValueError(f"schedule: unknown schedule {schedule!r}")
    return min_lr_ratio + (1.0 - min_lr_ratio) * shape
