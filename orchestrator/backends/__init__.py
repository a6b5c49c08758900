"""Backends run trials somewhere: `local` (process pool here), `ray`, `slurm`. One small interface (base.py).
Each module imports its cluster package (ray, submitit) only when a recipe uses it."""
from __future__ import annotations

from ..hardware import HardwareConfig
from .base import Backend, Launch, Outcome
from .local import LocalBackend
from .ray import RayBackend
from .slurm import SlurmBackend

BACKENDS = {"local": LocalBackend, "ray": RayBackend, "slurm": SlurmBackend}


def make_backend(hardware: HardwareConfig, workspace) -> Backend:
    name = hardware.backend
    if name not in BACKENDS:
        raise ValueError(f"hardware.backend: unknown backend {name!r}")
    return BACKENDS[name](hardware, workspace)


def check_backend(hardware: HardwareConfig, workspace) -> None:
    """Submit-time checks (reachable cluster, partition exists, enough GPUs): raise RecipeError, queue nothing."""
    BACKENDS.get(hardware.backend, SlurmBackend).check(hardware, workspace)


__all__ = ["Backend", "Launch", "Outcome", "make_backend", "check_backend"]
