"""The backend interface the driver uses. A backend starts trial attempts, reports how they ended, and can cancel
them. It never decides a trial's status: the driver reads the run dir (result.json / error.json) for that, so a
result is never only in a scheduler's memory."""
from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..hardware import HardwareConfig

RUNNER = "dpx.orchestrator.trial.runner"  # `python -m RUNNER RUN_DIR --attempt N`: what every backend launches


@dataclass
class Launch:
    recipe: str
    trial_id: str
    run_dir: Path
    attempt: int
    config: dict
    env: dict = field(default_factory=dict)

    def command(self, python: str = sys.executable) -> list[str]:
        return [python, "-m", RUNNER, str(self.run_dir), "--attempt", str(self.attempt)]


@dataclass
class Outcome:
    recipe: str
    trial_id: str
    attempt: int
    exit_code: Optional[int]  # None when unknown (adopted process, lost worker)
    reason: str = "exited"  # exited | timeout | lost | cancelled
    detail: str = ""


class Backend(ABC):
    name = "base"
    hw: HardwareConfig  # the recipe's hardware section, set by every backend's __init__

    @classmethod
    def check(cls, hardware: HardwareConfig, workspace) -> None:
        """Raise RecipeError when this hardware section cannot run here (checked before anything is queued)."""

    @abstractmethod
    def capacity(self) -> int:
        """How many more trials may start now."""

    @abstractmethod
    def start(self, launch: Launch) -> str:
        """Start one attempt; return a job handle (pid, Ray task id, Slurm job id) stored in the state."""

    @abstractmethod
    def poll(self) -> list[Outcome]:
        """Attempts that ended since the last poll."""

    @abstractmethod
    def cancel(self, recipe: str, trial_id: str, reason: str = "cancelled") -> None:
        """Stop a running attempt; it is reported by poll() with the given reason."""

    def flush(self) -> dict[str, str]:
        """Called after a round of start() calls: a backend that batches (Slurm job arrays) submits here and
        returns {trial_id: job handle} for the trials it submitted."""
        return {}

    def adopt(self, recipe: str, trial_id: str, handle: str, run_dir: Path, attempt: int) -> bool:
        """Watch an attempt started by a driver that died. False when it cannot be found (it is then lost)."""
        return False

    def running(self) -> int:
        return 0

    def workspace_limit(self) -> int | None:
        """At most this many trials on this backend run at once in the whole workspace, every recipe's (the
        driver's claims enforce it): `max_parallel`; None leaves scheduling to the cluster."""
        return self.hw.max_parallel

    def close(self) -> None:
        pass
