"""Local backend: one OS process per trial attempt on this machine, at most `max_parallel` at once.

Trials run in their own session (process group), so a killed driver does not take its trials down: a new driver
adopts them by pid and reads their run dir when they end. GPUs, when the recipe asks for them, are handed out one
set per trial through CUDA_VISIBLE_DEVICES.
"""
from __future__ import annotations

import json
import math
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from dpx.rundir import LOG, attempt_header

from ..errors import RecipeError
from ..hardware import HardwareConfig
from ..trial.ranks import set_safe_env
from ..trial.worker import pid_alive, registered
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


class GpuPool:
    """Which GPUs the local backend may hand out, and how much of each is taken.

    gpus_per_trial >= 1: a trial takes ceil(gpus_per_trial) whole, unused GPUs. Below 1, trials share a GPU: each
    takes that fraction of the least loaded GPU it fits on (0.25: four trials a GPU), as Ray counts fractional
    GPUs. A trial is never started without its GPUs."""

    EPS = 1e-9

    def __init__(self, ids: list[str], per_trial: float):
        self.ids, self.per = list(ids), float(per_trial)
        self.used = {g: 0.0 for g in self.ids}

    def _whole(self) -> int:
        return max(1, math.ceil(self.per))

    def holds(self) -> int:
        """Trials the pool holds at once when empty."""
        if self.per <= 0:
            return 0
        if self.per < 1:
            return len(self.ids) * int(1 / self.per + self.EPS)
        return len(self.ids) // self._whole()

    def fits(self) -> int:
        """Trials that can start now."""
        if self.per < 1:
            return sum(int((1 - u) / self.per + self.EPS) for u in self.used.values())
        return sum(u <= self.EPS for u in self.used.values()) // self._whole()

    def take(self) -> list[str]:
        """The GPU ids of one more trial (its CUDA_VISIBLE_DEVICES), or [] when none fits."""
        if self.per < 1:
            free = [g for g in self.ids if self.used[g] + self.per <= 1 + self.EPS]
            if not free:
                return []
            g = min(free, key=lambda x: self.used[x])  # spread: the least loaded GPU first
            self.used[g] += self.per
            return [g]
        idle = [g for g in self.ids if self.used[g] <= self.EPS][:self._whole()]
        if len(idle) < self._whole():
            return []
        for g in idle:
            self.used[g] = 1.0
        return idle

    def claim(self, ids: list[str]) -> list[str]:
        """Count an adopted trial's GPUs (from its worker.json) as taken; returns those that are ours."""
        mine = [g for g in ids if g in self.used]
        for g in mine:
            self.used[g] = min(1.0, self.used[g] + (self.per if self.per < 1 else 1.0))
        return mine

    def give_back(self, ids: list[str]) -> None:
        for g in ids:
            if g in self.used:
                self.used[g] = max(0.0, self.used[g] - (self.per if self.per < 1 else 1.0))


class LocalBackend(Backend):
    name = "local"

    def __init__(self, hardware: HardwareConfig, workspace):
        self.hw = hardware
        self.gpus_per_trial = float(hardware.gpus_per_trial)
        self.gpus = GpuPool(visible_gpus() if self.gpus_per_trial > 0 else [], self.gpus_per_trial)
        if self.gpus_per_trial > 0:
            held = self.gpus.holds()
            self.slots = min(int(hardware.max_parallel or held), held)
            if hardware.max_parallel and hardware.max_parallel > held:
                # more trials than the GPUs hold would start without a GPU ("No CUDA GPUs are available": the
                # table3 gpu_small run of 2026-12-01 with max_parallel 3 on one GPU); share GPUs with a fraction
                print(f"[local] hardware.max_parallel {hardware.max_parallel}, but {len(self.gpus.ids)} GPU(s) at "
                      f"gpus_per_trial {self.gpus_per_trial:g} hold {held} trial(s) at once: running {held}; set "
                      f"hardware.gpus_per_trial={1 / hardware.max_parallel:.3g} to share a GPU", flush=True)
        elif hardware.max_parallel:
            self.slots = int(hardware.max_parallel)
        else:
            self.slots = max(1, int((os.cpu_count() or 1) // float(hardware.cpus_per_trial)))
        self.procs: dict[tuple[str, str], tuple[subprocess.Popen | int, int, list[str], str]] = {}
        self.cancel_reason: dict[tuple[str, str], str] = {}
        self.kill_at: dict[tuple[str, str], float] = {}  # SIGTERM first (checkpoint), SIGKILL after the grace
        self.grace_s = float(os.environ.get("DPX_KILL_GRACE_S", "20"))
        self.use_fork = os.environ.get("DPX_FORKSERVER", "1") != "0"
        self.fs: ForkServer | None = None
        self.forked: set[int] = set()
        if self.use_fork:  # start it now: its imports (torch) overlap the driver's MLflow set-up
            self._forkserver()

    @classmethod
    def check(cls, hardware: HardwareConfig, workspace) -> None:
        need = float(hardware.gpus_per_trial)
        if need > 0:
            have = len(visible_gpus())
            if have < math.ceil(need):
                raise RecipeError(f"asks for {need:g} GPU(s) per trial but this machine has {have}",
                                  None, "hardware.gpus_per_trial")

    def capacity(self) -> int:
        room = self.slots - len(self.procs)
        return min(room, self.gpus.fits()) if self.gpus_per_trial > 0 else room

    def running(self) -> int:
        return len(self.procs)

    def workspace_limit(self) -> int:
        return self.slots  # this machine's: max_parallel, else what its CPUs or GPUs hold

    def start(self, launch: Launch) -> str:
        env = {**os.environ, **launch.env, "DPX_TRIAL_ID": launch.trial_id, "DPX_ATTEMPT": str(launch.attempt),
               "PYTHONUNBUFFERED": "1"}
        gpus: list[str] = []
        if self.gpus_per_trial > 0:
            gpus = self.gpus.take()
            if not gpus:  # capacity() said there was room: a bookkeeping error must not start a GPU-less trial
                raise RuntimeError(f"local backend: no free GPU share for trial {launch.trial_id}")
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        threads = HardwareConfig.of(launch.config).threads  # the trial's own section (a handed-over one may differ)
        env.setdefault("OMP_NUM_THREADS", str(threads))
        set_safe_env(env)  # NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1: no NVLink multicast
        log_path = Path(launch.run_dir) / LOG
        with open(log_path, "ab") as log:
            log.write(attempt_header(launch.attempt))
        key = (launch.recipe, launch.trial_id)
        fs = self._forkserver()
        if fs is not None:
            extra = {k: v for k, v in env.items() if os.environ.get(k) != v}
            pid = fs.spawn(str(launch.run_dir), launch.attempt, extra, str(log_path))
            if pid is not None:
                self.procs[key] = (pid, launch.attempt, gpus, str(launch.run_dir))
                self.forked.add(pid)
                return str(pid)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(launch.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, cwd=str(launch.run_dir), start_new_session=True)
        self.procs[key] = (proc, launch.attempt, gpus, str(launch.run_dir))
        return str(proc.pid)

    def _forkserver(self) -> "ForkServer | None":
        """The fork server, started on first use; None (plain processes) when disabled or broken."""
        if self.fs is None and self.use_fork:
            try:
                self.fs = ForkServer()
            except Exception as e:  # noqa: BLE001
                print(f"[local] fork server unavailable, starting trials as plain processes: {e}", flush=True)
                self.use_fork = False
        if self.fs is not None and not self.fs.alive():
            self.fs, self.use_fork = None, False
        return self.fs

    def adopt(self, recipe: str, trial_id: str, handle: str, run_dir: Path, attempt: int) -> bool:
        try:
            pid = int(handle)
        except (TypeError, ValueError):
            return False
        if not pid_alive(pid):
            return False
        info = registered(run_dir, attempt) or {}  # the worker's own record of the GPUs it was given
        ids = [g for g in (info.get("cuda_visible_devices") or "").split(",") if g.strip()]
        gpus = self.gpus.claim(ids) if self.gpus_per_trial > 0 else []
        self.procs[(recipe, trial_id)] = (pid, attempt, gpus, str(run_dir))
        return True

    def poll(self) -> list[Outcome]:
        done = []
        now = time.time()
        for key, (proc, attempt, gpus, _) in list(self.procs.items()):
            if key in self.kill_at and now > self.kill_at[key]:
                _kill_group(proc if isinstance(proc, int) else proc.pid, signal.SIGKILL)
            if isinstance(proc, int) and proc in self.forked:  # forked by the fork server: it reports the exit
                code = self.fs.exit_code(proc) if self.fs is not None else None
                if code is None:
                    if self.fs is not None and self.fs.alive() or pid_alive(proc):
                        continue
                self.forked.discard(proc)
            elif isinstance(proc, int):  # adopted: not our child, no exit code
                if pid_alive(proc):
                    continue
                code = None
            else:
                code = proc.poll()
                if code is None:
                    continue
            del self.procs[key]
            self.kill_at.pop(key, None)
            self.gpus.give_back(gpus)
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
        if self.fs is not None:
            self.fs.close()


class ForkServer:
    """Client side of trial/forkserver.py: a child process that forks trial attempts on request."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-m", "dpx.orchestrator.trial.forkserver"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, text=True,
                                     bufsize=1, start_new_session=True)
        self.replies: "queue.Queue[dict]" = queue.Queue()
        self.exits: dict[int, int] = {}
        self.lock = threading.Lock()
        self.n = 0
        self.ready = False
        threading.Thread(target=self._read, daemon=True).start()

    def _wait_ready(self, timeout: float = 300) -> None:
        if not self.ready:
            msg = self.replies.get(timeout=timeout)
            if "ready" not in msg:
                raise RuntimeError(f"unexpected fork server greeting {msg}")
            self.ready = True

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "exit" in msg:
                with self.lock:
                    self.exits[msg["pid"]] = msg["exit"]
            else:
                self.replies.put(msg)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def spawn(self, run_dir: str, attempt: int, env: dict, log: str, timeout: float = 60) -> int | None:
        self.n += 1
        try:
            self._wait_ready()
            self.proc.stdin.write(json.dumps({"id": self.n, "run_dir": run_dir, "attempt": attempt, "env": env,
                                              "log": log}) + "\n")
            self.proc.stdin.flush()
            msg = self.replies.get(timeout=timeout)
        except (OSError, queue.Empty, RuntimeError):
            return None
        return int(msg["pid"]) if msg.get("id") == self.n else None

    def exit_code(self, pid: int) -> int | None:
        with self.lock:
            return self.exits.pop(pid, None)

    def close(self) -> None:
        try:
            self.proc.stdin.close()  # the server reaps what still runs, then exits
        except OSError:
            pass


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
