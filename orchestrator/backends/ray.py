"""Ray backend: each trial attempt is one Ray task holding the recipe's resources (CPUs, GPUs, memory) that runs
the runner command as a subprocess on whichever node Ray picks. The run dir (on a filesystem every node sees) is
the result channel; the task only returns the exit code.

- `hardware.ray.address` unset: a fresh local instance sized from the recipe (`address="local"` always, never
  Ray's guess: a stale `ray_current_cluster` file makes a bare `ray.init()` retry forever). `auto`, `host:port`
  or `ray://host:port`: join that cluster.
- Ray itself never retries (max_retries=0): a lost worker (killed, OOM, node died) comes back as an outcome with
  reason "lost" and the driver retries it as a new, counted attempt (hardware.max_retries).
- The trial subprocess dies with its Ray worker (PR_SET_PDEATHSIG), so a retry never races an orphan that still
  writes the run dir.
- Cancel and per-trial timeout: `ray.cancel` raises KeyboardInterrupt in the task, which sends SIGTERM to the
  trial (it checkpoints), waits a grace period, then SIGKILLs it.
"""
from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ..distributed import set_safe_env
from ..errors import RecipeError
from .base import Backend, Launch, Outcome
from .local import visible_gpus

os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # local/CI clusters run without tokens; set `token` to opt in
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def _die_with_parent() -> None:
    """preexec_fn: the trial gets SIGKILL when the Ray worker that started it dies (Linux)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def run_trial_process(cmd_tail: list[str], run_dir: str, env: dict, attempt: int, grace_s: float) -> int:
    """Body of the Ray task (runs on a worker): start the runner, wait, forward a cancel as SIGTERM."""
    cmd = [sys.executable, *cmd_tail]  # the worker's own python: nodes may install the venv elsewhere
    full_env = {**os.environ, **env}
    with open(Path(run_dir) / "log.txt", "ab") as log:
        log.write(f"\n===== attempt {attempt} {time.strftime('%Y-%m-%d %H:%M:%S')} on {socket.gethostname()} "
                  f"(ray worker pid {os.getpid()}) =====\n".encode())
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full_env,
                                cwd=run_dir, start_new_session=True, preexec_fn=_die_with_parent)
    try:
        import ray

        ctx = ray.get_runtime_context()
    except Exception:  # noqa: BLE001 — called outside Ray (tests)
        ctx = None
    try:
        while True:  # short waits: ray.cancel only sets a flag (or interrupts between bytecodes)
            try:
                return proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                if ctx is not None and ctx.is_canceled():
                    raise KeyboardInterrupt("cancelled by the driver") from None
    except BaseException:
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        raise


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _split_address(address: str) -> tuple[str, int] | None:
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host, int(port)


def resolve_address(address: str | None) -> str:
    """The address handed to ray.init: "local" when unset; "auto" resolved (RAY_ADDRESS or the running head)."""
    if not address or address == "local":
        return "local"
    if address == "auto":
        try:
            from ray._private.services import canonicalize_bootstrap_address

            found = canonicalize_bootstrap_address("auto")
        except Exception:  # noqa: BLE001 — Ray raises ConnectionError when it finds nothing
            found = None
        if not found:
            raise RecipeError("address auto: no running Ray cluster found on this machine (start one with "
                              "`ray start --head`, or set RAY_ADDRESS)", None, "hardware.ray.address")
        return found
    return address


def _reachable(address: str, timeout: float = 3.0) -> None:
    hp = _split_address(address)
    if hp is None:
        raise RecipeError(f"{address!r} is not auto, host:port or ray://host:port", None, "hardware.ray.address")
    try:
        with socket.create_connection(hp, timeout=timeout):
            pass
    except OSError as e:
        raise RecipeError(f"Ray cluster at {address} is unreachable ({e.strerror or e})", None,
                          "hardware.ray.address") from None


def _local_size(hardware: dict) -> tuple[int, int]:
    r = hardware.get("ray") or {}
    cpus = r.get("num_cpus") or os.cpu_count() or 1
    gpus = r.get("num_gpus") if r.get("num_gpus") is not None else len(visible_gpus())
    return int(cpus), int(gpus)


def _fits(hardware: dict, cpus: float, gpus: float, where: str) -> None:
    need_g, need_c = float(hardware.get("gpus_per_trial") or 0), float(hardware.get("cpus_per_trial") or 1)
    if need_g > gpus:
        raise RecipeError(f"asks for {need_g:g} GPU(s) per trial but {where} has {gpus:g}", None,
                          "hardware.gpus_per_trial")
    if need_c > cpus:
        raise RecipeError(f"asks for {need_c:g} CPU(s) per trial but {where} has {cpus:g}", None,
                          "hardware.cpus_per_trial")


def _connect(ray, address: str, tries: int = 3, **kw) -> None:
    """ray.init with retries: on a loaded machine a local node can miss Ray's fixed 30 s start-up window, and the
    Ray Client proxy sometimes fails to fork its per-client server ("Starting Ray client server failed")."""
    for i in range(tries):
        try:
            ray.init(address=address, **kw)
            return
        except Exception:  # noqa: BLE001
            try:
                ray.shutdown()
            except Exception:  # noqa: BLE001
                pass
            if i == tries - 1:
                raise
            time.sleep(2 * (i + 1))


class RayBackend(Backend):
    name = "ray"

    def __init__(self, hardware: dict, workspace):
        import ray

        self.ray = ray
        self.hw = hardware
        self.settings = hardware.get("ray") or {}
        address = resolve_address(self.settings.get("address"))
        kw = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
        if address == "local":
            os.environ.pop("RAY_ADDRESS", None)  # the recipe asked for a local instance; Ray lets the env win
            cpus, gpus = _local_size(hardware)
            kw.update(num_cpus=cpus, num_gpus=gpus, object_store_memory=200 * 1024**2)
        else:
            kw.pop("include_dashboard")
        _connect(ray, address, **kw)
        self.address = address
        self.grace_s = float(os.environ.get("DPX_KILL_GRACE_S", "20"))
        total = ray.cluster_resources()
        need_c = float(hardware.get("cpus_per_trial") or 1)
        need_g = float(hardware.get("gpus_per_trial") or 0)
        slots = int(total.get("CPU", 1) // need_c)
        if need_g > 0:
            slots = min(slots, int(total.get("GPU", 0) // need_g))
        self.slots = int(hardware.get("max_parallel") or max(1, slots))
        mem = self.settings.get("memory_gb_per_trial")
        self.options = dict(num_cpus=need_c, num_gpus=need_g, max_retries=0, retry_exceptions=False)
        if mem:
            self.options["memory"] = int(mem * 1024**3)
        self.remote = ray.remote(run_trial_process)
        self.refs: dict[tuple[str, str], tuple[object, int]] = {}
        self.cancel_reason: dict[tuple[str, str], str] = {}
        self.force_at: dict[tuple[str, str], float] = {}

    @classmethod
    def check(cls, hardware: dict, workspace) -> None:
        address = resolve_address((hardware.get("ray") or {}).get("address"))
        if address == "local":
            cpus, gpus = _local_size(hardware)
            _fits(hardware, cpus, gpus, "the local Ray instance (hardware.ray.num_cpus/num_gpus)")
            return
        _reachable(address)
        import ray

        try:  # connecting to a live cluster takes well under a second; it tells us what the cluster has
            _connect(ray, address, log_to_driver=False, configure_logging=False)
            total = ray.cluster_resources()
        except Exception as e:  # noqa: BLE001
            lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()] or [type(e).__name__]
            raise RecipeError(f"cannot connect to Ray at {address}: {lines[-1][:300]}", None,
                              "hardware.ray.address") from None
        finally:
            ray.shutdown()
        _fits(hardware, total.get("CPU", 0), total.get("GPU", 0), f"the Ray cluster at {address}")

    def capacity(self) -> int:
        return self.slots - len(self.refs)

    def running(self) -> int:
        return len(self.refs)

    def start(self, launch: Launch) -> str:
        hw = launch.config.get("hardware", {})
        threads = hw.get("threads_per_trial") or max(1, int(float(hw.get("cpus_per_trial") or 1)))
        env = {**launch.env, "DPX_TRIAL_ID": launch.trial_id, "DPX_ATTEMPT": str(launch.attempt),
               "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(threads)}
        set_safe_env(env)  # no NVLink multicast on the nodes either; CUDA_VISIBLE_DEVICES comes from Ray's worker
        for k in ("DPX_MLFLOW_URI", "DPX_WORKSPACE"):  # remote nodes do not inherit the driver's environment
            if k in os.environ and k not in env:
                env[k] = os.environ[k]
        ref = self.remote.options(name=f"dpx:{launch.recipe}/{launch.trial_id}", **self.options).remote(
            launch.command()[1:], str(launch.run_dir), env, launch.attempt, self.grace_s)
        self.refs[(launch.recipe, launch.trial_id)] = (ref, launch.attempt)
        try:
            return ref.task_id().hex()
        except Exception:  # noqa: BLE001 — Ray Client refs have no task id
            return ref.hex()

    def poll(self) -> list[Outcome]:
        if not self.refs:
            return []
        now = time.time()
        for key, at in list(self.force_at.items()):  # a trial that ignored SIGTERM past the grace: kill the worker
            if now > at and key in self.refs:
                del self.force_at[key]
                self.ray.cancel(self.refs[key][0], force=True)
        by_ref = {v[0]: k for k, v in self.refs.items()}
        ready, _ = self.ray.wait(list(by_ref), num_returns=len(by_ref), timeout=0)
        out = []
        for ref in ready:
            key = by_ref[ref]
            _, attempt = self.refs.pop(key)
            self.force_at.pop(key, None)
            reason = self.cancel_reason.pop(key, None)
            code, detail = None, ""
            try:
                code = self.ray.get(ref)
                why = "exited"
            except self.ray.exceptions.TaskCancelledError:
                why = reason or "cancelled"
            except self.ray.exceptions.RayError as e:  # worker crashed, node died, OOM-killed, ...
                why = reason or "lost"
                detail = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"
            out.append(Outcome(key[0], key[1], attempt, code, reason or why, detail))
        return out

    def cancel(self, recipe: str, trial_id: str, reason: str = "cancelled") -> None:
        entry = self.refs.get((recipe, trial_id))
        if not entry:
            return
        self.cancel_reason[(recipe, trial_id)] = reason
        self.force_at[(recipe, trial_id)] = time.time() + self.grace_s + 10
        self.ray.cancel(entry[0], force=False)

    def close(self) -> None:
        try:
            self.ray.shutdown()
        except Exception:  # noqa: BLE001
            pass
