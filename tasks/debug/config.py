"""Config of the `debug` task: an orchestration self-test with no model."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DebugConfig:
    __pydantic_config__ = {"extra": "forbid"}

    name: str = "debug"
    steps: int = 3
    """metric points logged (one per step)"""
    sleep_s: float = 0.0
    """seconds slept in total, spread over the steps"""
    value: float = 1.0
    """the `score` metric reported at the end"""
    fail: bool = False
    """raise an exception at the end"""
    exit_code: int = 0
    """exit the process with this code (without writing a result) when non-zero"""
    nan_at_step: int = -1
    """report a NaN loss at this step (divergence), -1 for never"""
    fail_on_attempts: int = 0
    """fail the first N attempts, then succeed (retry tests)"""
    checkpoint: bool = False
    """save a checkpoint each step and resume from it (preemption tests)"""

    def __post_init__(self):
        if self.steps < 0:
            raise ValueError("steps: must be >= 0")
        if self.sleep_s < 0:
            raise ValueError("sleep_s: must be >= 0")
