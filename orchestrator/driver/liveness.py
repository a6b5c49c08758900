"""Whether a submission's driver is alive: the one rule, for the driver itself (adoption, turns), the backends
(Slurm's submit-time wait), the CLI (status, watch, cancel) and the API (wait).

On the driver's own host the answer is its pid; elsewhere its heartbeat in the state store (written every
HEARTBEAT_S; older than DEAD_AFTER_S is dead).
"""
from __future__ import annotations

import socket
import time

from ..trial.worker import pid_alive

HEARTBEAT_S = 2.0
DEAD_AFTER_S = 30.0  # a driver whose heartbeat is older than this, on another host, is taken for dead
ACTIVE = ("starting", "running", "cancelling")  # submission states in which a driver works
ENDED = ("done", "cancelled", "crashed")


def _process_alive(sub) -> bool | None:
    """The driver process on this host: alive or not; None when it runs on another host (undecidable by pid)."""
    if sub["driver_host"] == socket.gethostname():
        return pid_alive(sub["driver_pid"])
    return None


def driver_alive(sub) -> bool:
    """The submission has a driver at work: an active state and, by pid here or by heartbeat elsewhere, alive."""
    if sub is None or sub["state"] not in ACTIVE:
        return False
    here = _process_alive(sub)
    if here is not None:
        return here
    return (time.time() - (sub["heartbeat"] or 0)) < DEAD_AFTER_S


def driver_process_ended(sub) -> bool:
    """The driver process is gone (it finishes MLflow, DuckDB and figures after its state says done): by pid here;
    elsewhere once its state is final. True for a submission without a driver."""
    if sub is None or not sub["driver_pid"]:
        return True
    here = _process_alive(sub)
    if here is not None:
        return not here
    return sub["state"] in ENDED
