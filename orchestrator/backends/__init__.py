"""Backends run trials somewhere: `local` (process pool here), `ray`, `slurm`. One small interface (base.py)."""
from __future__ import annotations

from .base import Backend, Launch, Outcome


def make_backend(hardware: dict, workspace) -> Backend:
    name = hardware.get("backend", "local")
    if name == "local":
        from .local import LocalBackend

        return LocalBackend(hardware, workspace)
    if name == "ray":
        from .ray import RayBackend

        return RayBackend(hardware, workspace)
    if name == "slurm":
        from .slurm import SlurmBackend

        return SlurmBackend(hardware, workspace)
    raise ValueError(f"hardware.backend: unknown backend {name!r}")


def check_backend(hardware: dict, workspace) -> None:
    """Submit-time checks (reachable cluster, partition exists, enough GPUs): raise RecipeError, queue nothing."""
    name = hardware.get("backend", "local")
    if name == "local":
        from .local import LocalBackend as cls
    elif name == "ray":
        from .ray import RayBackend as cls
    else:
        from .slurm import SlurmBackend as cls
    cls.check(hardware, workspace)


__all__ = ["Backend", "Launch", "Outcome", "make_backend", "check_backend"]
