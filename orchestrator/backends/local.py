"""Local backend: one OS process per trial attempt on this machine, at most `max_parallel` at once.

Trials run in their own session (process group), so a killed driver does not take its trials down: a new driver
adopts them by pid and reads their run dir when they end. GPUs, when the recipe asks for them, are handed out one
set per trial through CUDA_VISIBLE_DEVICES.
"""
from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from ..state import pid_alive
from .base import Backend, Launch, Outcome


def visible_gpus() -> list[str]:
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g for g in env.split(",") if g.strip()]
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
            return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]
        except (OSError, subprocess.SubprocessError):
            return []
    return []


class LocalBackend(Backend):
    name = "local"

    def __init__(self, hardware: dict, workspace):
        self.hw = hardware
        self.gpus_per_trial = float(hardware.get("gpus_per_trial") or 0)
        self.free_gpus = visible_gpus() if self.gpus_per_trial > 0 else []
        if hardware.get("max_parallel"):
            self.slots = int(hardware["max_parallel"])
        elif self.gpus_per_trial > 0:
            self.slots = max(1, int(len(self.free_gpus) // max(1, math.ceil(self.gpus_per_trial))))
        else:
            self.slots = max(1, int((os.cpu_count() or 1) // float(hardware.get("cpus_per_trial") or 1)))
        self.procs: dict[tuple[str, str], tuple[subprocess.Popen | int, int, list[str], str]] = {}
        self.cancel_reason: dict[tuple[str, str], str] = {}
        self.kill_at: dict[tuple[str, str], float] = {}  # SIGTERM first (checkpoint), SIGKILL after the grace
        self.grace_s = float(os.environ.get("DPX_KILL_GRACE_S", "20"))

    @classmethod
    def check(cls, hardware: dict, workspace) -> None:
        from ..errors import RecipeError

        need = float(hardware.get("gpus_per_trial") or 0)
        if need > 0:
            have = len(visible_gpus())
            if have < math.ceil(need):
                raise RecipeError(f"asks for {need:g} GPU(s) per trial but this machine has {have}",
                                  None, "hardware.gpus_per_trial")

    def capacity(self) -> int:
        return self.slots - len(self.procs)

    def running(self) -> int:
        return len(self.procs)

    def start(self, launch: Launch) -> str:
        env = {**os.environ, **launch.env, "DPX_TRIAL_ID": launch.trial_id, "DPX_ATTEMPT": str(launch.attempt),
               "PYTHONUNBUFFERED": "1"}
        gpus: list[str] = []
        if self.gpus_per_trial > 0:
            n = max(1, math.ceil(self.gpus_per_trial))
            gpus, self.free_gpus = self.free_gpus[:n], self.free_gpus[n:]
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        threads = launch.config.get("hardware", {}).get("threads_per_trial") or max(
            1, int(float(launch.config.get("hardware", {}).get("cpus_per_trial") or 1)))
        env.setdefault("OMP_NUM_THREADS", str(threads))
        log = open(Path(launch.run_dir) / "log.txt", "ab")
        log.write(f"\n===== attempt {launch.attempt} {time.strftime('%Y-%m-%d %H:%M:%S')} =====\n".encode())
        log.flush()
        proc = subprocess.Popen(launch.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=str(launch.run_dir), start_new_session=True)
        log.close()
        self.procs[(launch.recipe, launch.trial_id)] = (proc, launch.attempt, gpus, str(launch.run_dir))
        return str(proc.pid)

    def adopt(self, recipe: str, trial_id: str, handle: str, run_dir: Path, attempt: int) -> bool:
        try:
            pid = int(handle)
        except (TypeError, ValueError):
            return False
        if not pid_alive(pid):
            return False
        self.procs[(recipe, trial_id)] = (pid, attempt, [], str(run_dir))
        return True

    def poll(self) -> list[Outcome]:
        done = []
        now = time.time()
        for key, (proc, attempt, gpus, _) in list(self.procs.items()):
            if key in self.kill_at and now > self.kill_at[key]:
                _kill_group(proc if isinstance(proc, int) else proc.pid, signal.SIGKILL)
            if isinstance(proc, int):  # adopted: not our child, no exit code
                if pid_alive(proc):
                    continue
                code = None
            else:
                code = proc.poll()
                if code is None:
                    continue
            del self.procs[key]
            self.kill_at.pop(key, None)
            self.free_gpus += gpus
            reason = self.cancel_reason.pop(key, "exited")
            done.append(Outcome(key[0], key[1], attempt, code, reason))
        return done

    def cancel(self, recipe: str, trial_id: str, reason: str = "cancelled") -> None:
        entry = self.procs.get((recipe, trial_id))
        if not entry:
            return
        self.cancel_reason[(recipe, trial_id)] = reason
        self.kill_at[(recipe, trial_id)] = time.time() + self.grace_s
        pid = entry[0] if isinstance(entry[0], int) else entry[0].pid
        _kill_group(pid, signal.SIGTERM)

    def close(self) -> None:
        pass


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
