"""Ray backend: each trial attempt is one Ray actor holding the recipe's resources (CPUs, GPUs, memory) that runs
the runner command as a subprocess on whichever node Ray picks. The run dir (on a filesystem every node sees) is
the result channel; the actor only returns the exit code.

- `hardware.ray.address` unset: a fresh local instance sized from the recipe (`address="local"` always, never
  Ray's guess: a stale `ray_current_cluster` file makes a bare `ray.init()` retry forever). `auto`, `host:port`
  or `ray://host:port`: join that cluster.
- On a cluster the actors are detached and named (`dpx/<recipe>/<trial>/<attempt>`): a killed driver loses
  nothing; the next `dpx submit` adopts the running attempts by name.
- Ray itself never retries (max_restarts=0): a lost worker (killed, OOM, node died) comes back as an outcome with
  reason "lost" and the driver retries it as a new, counted attempt (hardware.max_retries).
- The trial subprocess dies with its Ray worker (PR_SET_PDEATHSIG), so a retry never races an orphan that still
  writes the run dir.
- Cancel and per-trial timeout: the actor sends SIGTERM to the trial (it checkpoints), SIGKILL after the grace
  period (DPX_KILL_GRACE_S); an actor that does not answer is killed.
"""
from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from dpx.rundir import LOG, attempt_header

from ..errors import RecipeError
from ..hardware import HardwareConfig
from ..trial.ranks import set_safe_env
from .base import Backend, Launch, Outcome
from .local import visible_gpus

os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # local/CI clusters run without tokens; set `token` to opt in
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
NAMESPACE = "dpx"  # trial actors are named dpx/<recipe>/<trial_id>/<attempt> in this namespace


def _die_with_parent() -> None:
    """preexec_fn: the trial gets SIGKILL when the Ray worker that started it dies (Linux)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class TrialActor:
    """One trial attempt on a Ray worker (a threaded actor, so `wait` and `stop` answer while `run` runs).

    On a cluster it is detached: it outlives a killed driver, and the next driver finds it by name and waits
    for it, so nothing running is lost. Its resources (CPUs, GPUs, memory) are held for its lifetime, which
    ends when the driver kills it after reading the outcome."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.code: int | None = None
        self.ended = threading.Event()

    def run(self, cmd_tail: list[str], run_dir: str, env: dict, attempt: int) -> int:
        cmd = [sys.executable, *cmd_tail]  # the worker's own python: nodes may install the venv elsewhere
        try:
            with open(Path(run_dir) / LOG, "ab") as log:
                log.write(attempt_header(attempt, f"on {socket.gethostname()} (ray worker pid {os.getpid()})"))
                log.flush()
                self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             env={**os.environ, **env}, cwd=run_dir, start_new_session=True,
                                             preexec_fn=_die_with_parent)
            while (code := self.proc.poll()) is None:  # this thread forked it: PDEATHSIG needs it alive
                time.sleep(0.3)
            self.code = code
            return code
        finally:
            self.ended.set()
            # a detached actor nobody reads (its driver died and no `dpx submit` came back) would hold its CPUs and
            # GPUs forever: leave after a while; the run dir still tells a later driver how the attempt ended
            threading.Thread(target=_exit_after, args=(float(os.environ.get("DPX_RAY_LINGER_S", "300")),),
                             daemon=True).start()

    def wait(self) -> int | None:
        self.ended.wait()
        return self.code

    def stop(self, grace_s: float) -> None:
        """SIGTERM (the trial checkpoints and exits), SIGKILL after the grace period."""
        if self.proc is None:
            return
        _signal_group(self.proc.pid, signal.SIGTERM)
        if not self.ended.wait(grace_s):
            _signal_group(self.proc.pid, signal.SIGKILL)


def _exit_after(seconds: float) -> None:
    time.sleep(seconds)
    os._exit(0)


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
    if address != "auto":  # an explicit recipe wins over RAY_ADDRESS (ray.init would let the variable win)
        os.environ.pop("RAY_ADDRESS", None)
    if not address or address == "local":
        return "local"
    if address == "auto":
        try:
            from ray._private.services import canonicalize_bootstrap_address  # ray: an extra (hardware.backend: ray)

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


def _local_size(hardware: HardwareConfig) -> tuple[int, int]:
    r = hardware.ray
    cpus = r.num_cpus or os.cpu_count() or 1
    gpus = r.num_gpus if r.num_gpus is not None else len(visible_gpus())
    return int(cpus), int(gpus)


def _fits(hardware: HardwareConfig, cpus: float, gpus: float, where: str) -> None:
    need_g, need_c = float(hardware.gpus_per_trial), float(hardware.cpus_per_trial)
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

    def __init__(self, hardware: HardwareConfig, workspace):
        import ray  # ray: an extra, loaded only when a recipe uses this backend

        self.ray = ray
        self.hw = hardware
        self.settings = hardware.ray
        address = resolve_address(self.settings.address)
        kw = dict(include_dashboard=False, log_to_driver=False, configure_logging=False, namespace=NAMESPACE)
        if address == "local":
            cpus, gpus = _local_size(hardware)
            kw.update(num_cpus=cpus, num_gpus=gpus, object_store_memory=200 * 1024**2)
        else:
            kw.pop("include_dashboard")
        _connect(ray, address, **kw)
        self.address = address
        self.grace_s = float(os.environ.get("DPX_KILL_GRACE_S", "20"))
        total = ray.cluster_resources()
        need_c = float(hardware.cpus_per_trial)
        need_g = float(hardware.gpus_per_trial)
        slots = int(total.get("CPU", 1) // need_c)
        if need_g > 0:
            slots = min(slots, int(total.get("GPU", 0) // need_g))
        self.slots = int(hardware.max_parallel or max(1, slots))
        mem = self.settings.memory_gb_per_trial
        self.options = dict(num_cpus=need_c, num_gpus=need_g, max_restarts=0, max_task_retries=0,
                            max_concurrency=4, namespace=NAMESPACE)
        if mem:
            self.options["memory"] = int(mem * 1024**3)
        if address != "local":  # a local instance dies with the driver anyway
            self.options["lifetime"] = "detached"
        self.actor_cls = ray.remote(TrialActor)
        self.live: dict[tuple[str, str], dict] = {}  # key → {"ref", "actor", "attempt"}
        self.cancel_reason: dict[tuple[str, str], str] = {}
        self.kill_at: dict[tuple[str, str], float] = {}

    @classmethod
    def check(cls, hardware: HardwareConfig, workspace) -> None:
        address = resolve_address(hardware.ray.address)
        if address == "local":
            cpus, gpus = _local_size(hardware)
            _fits(hardware, cpus, gpus, "the local Ray instance (hardware.ray.num_cpus/num_gpus)")
            return
        _reachable(address)
        import ray  # ray: an extra, loaded only when a recipe uses this backend

        try:  # connecting to a live cluster takes about a second; it tells us what the cluster has
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
        return self.slots - len(self.live)

    def running(self) -> int:
        return len(self.live)

    def start(self, launch: Launch) -> str:
        threads = HardwareConfig.of(launch.config).threads  # the trial's own section (a handed-over one may differ)
        env = {**launch.env, "DPX_TRIAL_ID": launch.trial_id, "DPX_ATTEMPT": str(launch.attempt),
               "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(threads)}
        set_safe_env(env)  # no NVLink multicast on the nodes either; CUDA_VISIBLE_DEVICES comes from Ray's worker
        for k in ("DPX_MLFLOW_URI", "DPX_WORKSPACE"):  # remote nodes do not inherit the driver's environment
            if k in os.environ and k not in env:
                env[k] = os.environ[k]
        name = f"dpx/{launch.recipe}/{launch.trial_id}/{launch.attempt}"
        try:  # a leftover of this very attempt (driver killed between start and adopt): replace it
            self.ray.kill(self.ray.get_actor(name, namespace=NAMESPACE))
        except ValueError:
            pass
        actor = self.actor_cls.options(name=name, **self.options).remote()
        ref = actor.run.remote(launch.command()[1:], str(launch.run_dir), env, launch.attempt)
        self.live[(launch.recipe, launch.trial_id)] = {"ref": ref, "actor": actor, "attempt": launch.attempt}
        return name

    def adopt(self, recipe: str, trial_id: str, handle: str, run_dir: Path, attempt: int) -> bool:
        """Find the detached actor of a dead driver's trial and wait for it (cluster mode only)."""
        if self.address == "local" or not handle or not handle.startswith("dpx/"):
            return False
        try:
            actor = self.ray.get_actor(handle, namespace=NAMESPACE)
        except ValueError:
            return False
        self.live[(recipe, trial_id)] = {"ref": actor.wait.remote(), "actor": actor, "attempt": attempt}
        return True

    def poll(self) -> list[Outcome]:
        if not self.live:
            return []
        now = time.time()
        for key, at in list(self.kill_at.items()):  # a trial that ignored SIGTERM past the grace: kill the actor
            if now > at and key in self.live:
                del self.kill_at[key]
                self.ray.kill(self.live[key]["actor"])
        by_ref = {v["ref"]: k for k, v in self.live.items()}
        ready, _ = self.ray.wait(list(by_ref), num_returns=len(by_ref), timeout=0)
        out = []
        for ref in ready:
            key = by_ref[ref]
            entry = self.live.pop(key)
            self.kill_at.pop(key, None)
            reason = self.cancel_reason.pop(key, None)
            code, detail, why = None, "", "exited"
            try:
                code = self.ray.get(ref)
            except self.ray.exceptions.RayError as e:  # worker crashed, node died, OOM-killed, actor killed
                why = "lost"
                detail = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"
            try:  # detached actors live until killed; their resources go back to the cluster now
                self.ray.kill(entry["actor"])
            except Exception:  # noqa: BLE001
                pass
            out.append(Outcome(key[0], key[1], entry["attempt"], code, reason or why, detail))
        return out

    def cancel(self, recipe: str, trial_id: str, reason: str = "cancelled") -> None:
        entry = self.live.get((recipe, trial_id))
        if not entry:
            return
        self.cancel_reason[(recipe, trial_id)] = reason
        self.kill_at[(recipe, trial_id)] = time.time() + self.grace_s + 15
        entry["actor"].stop.remote(self.grace_s)

    def close(self) -> None:
        try:
            self.ray.shutdown()
        except Exception:  # noqa: BLE001
            pass
