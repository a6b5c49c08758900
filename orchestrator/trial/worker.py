"""A trial attempt's worker registers itself in its run dir (`worker.json`: attempt, pid, process group, host,
process start time), first thing, before any task code runs.

Why: the driver records a worker's pid in the state store one SQLite update after starting it. A driver killed in
between leaves a running trial with no pid; without this file the next driver could not find the process and
would settle the trial as "worker lost" (and, with retries, run it a second time beside the first). With it, the
next driver adopts the process by the pid the worker wrote; an attempt whose header is in the log but whose worker
has not registered yet (a plain process still starting Python) is "unknown" for a grace period, not lost.

Standard library only: the runner imports this on bare nodes. `pid_alive` is the one process check of dpx
(drivers, backends and the CLI use it too).
"""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from dpx.rundir import ATTEMPT_HEADER, HEADER_TIME, LOG, WORKER

REGISTER_GRACE_S = float(os.environ.get("DPX_REGISTER_GRACE_S", "60"))
"""how long after its attempt header an unregistered attempt counts as still starting"""


def proc_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22): with the pid, it names one
    process, so a recycled pid is not mistaken for the worker."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def register(run_dir: str | Path, attempt: int) -> None:
    pid = os.getpid()
    info = {"attempt": attempt, "pid": pid, "pgid": os.getpgid(pid), "host": socket.gethostname(),
            "proc_start": proc_start(pid), "time": time.time(),
            # the GPUs it was given: a driver that adopts the attempt counts them as taken (a forked trial's
            # /proc/PID/environ still shows the fork server's environment, so it is read from here)
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    tmp = Path(run_dir) / f".{WORKER}.{pid}"
    try:
        tmp.write_text(json.dumps(info))
        os.replace(tmp, Path(run_dir) / WORKER)  # atomic: a reader sees the old worker or the new one
    except OSError:  # an unwritable run dir: the runner fails next, with the path, in error.json / the log
        pass


def registered(run_dir: str | Path, attempt: int) -> dict | None:
    """The registration of this attempt's worker, or None (not registered yet, or an older attempt's)."""
    try:
        info = json.loads((Path(run_dir) / WORKER).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and info.get("attempt") == attempt else None


def alive(info: dict) -> bool:
    """Whether the registered worker still runs (decidable on its own host only; elsewhere assumed alive)."""
    if info.get("host") != socket.gethostname():
        return True
    if not pid_alive(info.get("pid")):
        return False
    start = info.get("proc_start")
    return start is None or proc_start(int(info["pid"])) == start


def header_time(run_dir: str | Path, attempt: int) -> float | None:
    """When the backend wrote this attempt's header into log.txt (local time, to the second), or None."""
    try:
        text = (Path(run_dir) / LOG).read_text(errors="replace")
    except OSError:
        return None
    mark = f"{ATTEMPT_HEADER}{attempt} "
    i = text.rfind(mark)
    if i < 0:
        return None
    try:
        return time.mktime(time.strptime(text[i + len(mark):i + len(mark) + 19], HEADER_TIME))
    except ValueError:
        return None


def pid_alive(pid: int | None, host: str | None = None) -> bool:
    """Whether a process of ours is alive (only decidable on its own host; elsewhere assume alive)."""
    if not pid:
        return False
    if host and host != socket.gethostname():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True
