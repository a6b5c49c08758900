"""Slurm backend: trials go out as submitit job arrays (`map_array`), one array task per trial attempt, all the
trials a driver round starts in one sbatch call (chunks of 1000), `array_parallelism` of them running at once.

- Each array task runs `SlurmTrial`, which starts the runner command as a subprocess (the run dir, on a shared
  filesystem, is the result channel; the task's own result pickle is never read).
- Preemption and timeout go through submitit's checkpoint hook: Slurm sends USR2 (`--signal=USR2@90`),
  `SlurmTrial.checkpoint` passes SIGTERM to the trial, which saves its checkpoint, and submitit requeues the same
  array task with the same arguments: same trial id, run dir, attempt number and MLflow run, resuming from the
  checkpoint. `scontrol requeue` works the same way (the trial gets SIGTERM directly).
- Status comes from squeue (live and recently ended jobs) and sacct (everything older), at most every few
  seconds; the driver writes it into the state store. A job the scheduler never heard of is "lost".
- `dpx rerun --failed` puts only the failed trials back to pending, so the new array holds only those.
"""
from __future__ import annotations

import ctypes
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dpx.rundir import LOG, attempt_header

from ..driver.liveness import driver_alive
from ..errors import RecipeError, did_you_mean
from ..hardware import HardwareConfig
from ..trial.ranks import set_safe_env
from .base import RUNNER, Backend, Launch, Outcome

QUEUED = "slurm:queued"  # handle of a trial started this round but not yet in an sbatch call (flush)
ALIVE = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SUSPENDED", "COMPLETING",
         "CONFIGURING", "STOPPED", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD", "SPECIAL_EXIT"}
LOST = {"NODE_FAIL", "BOOT_FAIL", "OUT_OF_MEMORY", "TIMEOUT", "DEADLINE", "PREEMPTED"}
JOB_ID = re.compile(r"^\d+(_\d+)?$")


def _die_with_parent() -> None:
    """preexec_fn of the trial: ignore USR2 (the preemption signal is for submitit, not for the trial, which would
    otherwise die of it: scancel --signal and Slurm's own warning signal reach every process of the step) and die
    when the submitit process dies."""
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class SlurmTrial:
    """The callable submitit pickles into each array task."""

    def __init__(self, grace_s: float = 60.0):
        self.grace_s = grace_s
        self.proc: subprocess.Popen | None = None

    def __call__(self, run_dir: str, attempt: int, env: dict) -> int:
        cmd = [sys.executable, "-m", RUNNER, run_dir, "--attempt", str(attempt)]
        job = os.environ.get("SLURM_ARRAY_JOB_ID", os.environ.get("SLURM_JOB_ID", "?"))
        if "SLURM_ARRAY_TASK_ID" in os.environ:
            job += "_" + os.environ["SLURM_ARRAY_TASK_ID"]
        with open(Path(run_dir) / LOG, "ab") as log:
            log.write(attempt_header(attempt, f"on {os.uname().nodename} (slurm job {job}, restart "
                                              f"{os.environ.get('SLURM_RESTART_COUNT', '0')})"))
            log.flush()
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env={**os.environ, **env}, cwd=run_dir, preexec_fn=_die_with_parent)
        try:  # poll, never wait(): the preemption handler runs on this thread and Popen.wait holds a lock
            while (code := self.proc.poll()) is None:
                time.sleep(0.5)
        except BaseException:  # submitit's requeue exits from a signal handler: never leave the trial behind
            self._stop()
            raise
        if code != 0:  # a failed trial fails its array task too (sacct shows FAILED, not COMPLETED)
            raise RuntimeError(f"trial exited with code {code}; see {run_dir}/error.json and log.txt")
        return code

    def _stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        deadline = time.time() + self.grace_s
        while self.proc.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        if self.proc.poll() is None:
            self.proc.kill()
            while self.proc.poll() is None:
                time.sleep(0.1)

    def checkpoint(self, run_dir: str, attempt: int, env: dict):
        """submitit's preemption/timeout hook: let the trial save its checkpoint, then requeue the same call."""
        import submitit  # submitit: an extra, loaded only when a recipe uses this backend

        self._stop()
        return submitit.helpers.DelayedSubmission(SlurmTrial(self.grace_s), run_dir, attempt, env)


def _run(cmd: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _params(hardware: HardwareConfig) -> dict:
    """submitit SlurmExecutor parameters from the recipe's hardware section."""
    s = hardware.slurm
    p = {"time": max(1, int(math.ceil(s.time_min))),
         "cpus_per_task": max(1, int(math.ceil(float(hardware.cpus_per_trial)))),
         "array_parallelism": int(s.array_parallelism),
         "stderr_to_stdout": True,
         "signal_delay_s": int(s.signal_delay_s or 90)}  # 0: the default, as before
    if s.partition:
        p["partition"] = s.partition
    gpus = float(hardware.gpus_per_trial)
    if gpus > 0:
        p["gpus_per_node"] = int(math.ceil(gpus))
    if s.mem_gb:
        p["mem"] = f"{int(math.ceil(float(s.mem_gb) * 1024))}M"
    if s.setup:
        p["setup"] = list(s.setup)
    if s.additional_parameters:
        p["additional_parameters"] = dict(s.additional_parameters)
    return p


def _partitions() -> dict[str, dict]:
    """{partition: {"default": bool, "cpus": max CPUs per node, "gpus": max GPUs per node}} from sinfo."""
    r = _run(["sinfo", "-h", "-o", "%P|%c|%G"])
    if r.returncode != 0:
        raise RecipeError(f"sinfo failed: {(r.stderr or r.stdout).strip().splitlines()[-1:] or ['no output']}"[:300],
                          None, "hardware.backend")
    parts: dict[str, dict] = {}
    for line in r.stdout.splitlines():
        name, cpus, gres = (line.split("|") + ["", "", ""])[:3]
        default = name.endswith("*")
        name = name.rstrip("*")
        gpus = sum(int(m.group(1)) for m in re.finditer(r"gpu(?::[^:,(]+)?:(\d+)", gres))
        cur = parts.setdefault(name, {"default": default, "cpus": 0, "gpus": 0})
        cur["cpus"] = max(cur["cpus"], int(re.sub(r"\D", "", cpus) or 0))
        cur["gpus"] = max(cur["gpus"], gpus)
    return parts


class SlurmBackend(Backend):
    name = "slurm"

    def __init__(self, hardware: HardwareConfig, workspace):
        import submitit  # submitit: an extra, loaded only when a recipe uses this backend

        self.hw = hardware
        s = hardware.slurm
        folder = Path(s.folder or Path(workspace.root) / "slurm")
        self.executor = submitit.SlurmExecutor(folder=folder / "%j", max_num_timeout=int(s.max_num_timeout))
        self.executor.update_parameters(**_params(hardware))
        self.grace_s = float(os.environ.get("DPX_KILL_GRACE_S", "60"))
        self.poll_s = float(os.environ.get("DPX_SLURM_POLL_S", "3"))
        self.queue: list[Launch] = []
        self.jobs: dict[tuple[str, str], dict] = {}  # key → {"job", "attempt", "since"}
        self.cancel_reason: dict[tuple[str, str], str] = {}
        self.outcomes: list[Outcome] = []
        self.last_poll = 0.0

    # ---- submit-time checks -----------------------------------------------------------------------------------
    @classmethod
    def check(cls, hardware: HardwareConfig, workspace) -> None:
        for tool in ("sbatch", "sinfo", "squeue", "scancel"):
            if shutil.which(tool) is None:
                raise RecipeError(f"slurm: `{tool}` not found on PATH (run dpx on a Slurm login node)", None,
                                  "hardware.backend")
        if hardware.timeout_min:
            raise RecipeError("not used on Slurm (a queued job would count as running); set "
                              "hardware.slurm.time_min, the wall-time limit per array task", None,
                              "hardware.timeout_min")
        parts = _partitions()
        name = hardware.slurm.partition
        if name and name not in parts:
            raise RecipeError(f"partition {name!r} does not exist{did_you_mean(name, parts)}; "
                              f"partitions: {', '.join(parts) or 'none'}", None, "hardware.slurm.partition")
        if not name:
            name = next((p for p, v in parts.items() if v["default"]), None)
            if name is None:
                raise RecipeError(f"the cluster has no default partition; choose one of {', '.join(parts)}",
                                  None, "hardware.slurm.partition")
        gpus, cpus = float(hardware.gpus_per_trial), float(hardware.cpus_per_trial)
        if gpus > parts[name]["gpus"]:
            raise RecipeError(f"asks for {gpus:g} GPU(s) per trial but partition {name!r} has at most "
                              f"{parts[name]['gpus']} per node", None, "hardware.gpus_per_trial")
        if parts[name]["cpus"] and cpus > parts[name]["cpus"]:
            raise RecipeError(f"asks for {cpus:g} CPU(s) per trial but partition {name!r} has at most "
                              f"{parts[name]['cpus']} per node", None, "hardware.cpus_per_trial")
        cls._test_only(hardware)

    @staticmethod
    def _test_only(hardware: HardwareConfig) -> None:
        """`sbatch --test-only` on the script submitit would write: memory, time, extra options, account, qos."""
        from submitit.slurm.slurm import _make_sbatch_string  # submitit: an extra (hardware.backend: slurm)

        with tempfile.TemporaryDirectory(prefix="dpx-sbatch-") as tmp:
            script = Path(tmp) / "test.sh"
            try:
                script.write_text(_make_sbatch_string(command="true", folder=tmp, **_params(hardware)))
            except (TypeError, ValueError) as e:
                raise RecipeError(str(e).splitlines()[0][:300], None, "hardware.slurm") from None
            r = _run(["sbatch", "--test-only", str(script)])
        if r.returncode != 0:
            msg = [ln for ln in (r.stderr or r.stdout).splitlines() if ln.strip()]
            line = re.sub(r"^sbatch: error:\s*", "", msg[-1] if msg else "rejected")
            raise RecipeError(f"sbatch rejects these settings: {line}"[:400], None, "hardware.slurm")

    # ---- the Backend interface ----------------------------------------------------------------------------------
    def capacity(self) -> int:
        return 100_000  # Slurm queues; array_parallelism bounds what runs at once

    def running(self) -> int:
        return len(self.jobs) + len(self.queue)

    def start(self, launch: Launch) -> str:
        self.queue.append(launch)
        return QUEUED

    def flush(self) -> dict[str, str]:
        out: dict[str, str] = {}
        while self.queue:
            batch, self.queue = self.queue[:1000], self.queue[1000:]
            envs = []
            for ln in batch:
                threads = HardwareConfig.of(ln.config).threads  # the trial's own section
                env = {**ln.env, "DPX_TRIAL_ID": ln.trial_id, "DPX_ATTEMPT": str(ln.attempt),
                       "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(threads)}
                set_safe_env(env)  # no NVLink multicast on shared nodes
                envs.append(env)
            self.executor.update_parameters(job_name=f"dpx-{batch[0].recipe}"[:64])
            try:
                jobs = self.executor.map_array(SlurmTrial(self.grace_s), [str(ln.run_dir) for ln in batch],
                                               [ln.attempt for ln in batch], envs)
            except Exception as e:  # noqa: BLE001 — sbatch refused: each trial fails with sbatch's reason
                why = str(e).strip().splitlines()
                for ln in batch:
                    self.outcomes.append(Outcome(ln.recipe, ln.trial_id, ln.attempt, None, "lost",
                                                 f"sbatch failed: {why[-1] if why else type(e).__name__}"[:400]))
                continue
            now = time.time()
            for ln, job in zip(batch, jobs):
                self.jobs[(ln.recipe, ln.trial_id)] = {"job": job.job_id, "attempt": ln.attempt, "since": now}
                out[ln.trial_id] = job.job_id
        return out

    def poll(self) -> list[Outcome]:
        done, self.outcomes = self.outcomes, []
        now = time.time()
        if not self.jobs or now - self.last_poll < self.poll_s:
            return done
        self.last_poll = now
        states = self.states([j["job"] for j in self.jobs.values()])
        for key, j in list(self.jobs.items()):
            st = states.get(j["job"])
            if st is None:
                if now - j["since"] > 120:  # neither squeue nor sacct knows it: purged or never existed
                    del self.jobs[key]
                    done.append(Outcome(key[0], key[1], j["attempt"], None, self.cancel_reason.pop(key, "lost"),
                                        f"Slurm job {j['job']} is unknown to squeue and sacct"))
                continue
            state, code = st
            if state in ALIVE:
                continue
            del self.jobs[key]
            reason = self.cancel_reason.pop(key, None)
            if reason is None:
                reason = end_reason(state)
            done.append(Outcome(key[0], key[1], j["attempt"], code, reason, f"Slurm job {j['job']} ended {state}"))
        return done

    def cancel(self, recipe: str, trial_id: str, reason: str = "cancelled") -> None:
        key = (recipe, trial_id)
        for ln in list(self.queue):
            if (ln.recipe, ln.trial_id) == key:
                self.queue.remove(ln)
                self.outcomes.append(Outcome(recipe, trial_id, ln.attempt, None, reason))
                return
        if key in self.jobs:
            self.cancel_reason[key] = reason
            _run(["scancel", self.jobs[key]["job"]])

    def adopt(self, recipe: str, trial_id: str, handle: str, run_dir: Path, attempt: int) -> bool:
        if not handle or not JOB_ID.match(handle):
            return False
        st = self.states([handle]).get(handle)
        if st is None:
            return False
        self.jobs[(recipe, trial_id)] = {"job": handle, "attempt": attempt, "since": time.time()}
        return True

    # ---- scheduler queries --------------------------------------------------------------------------------------
    @staticmethod
    def states(job_ids: list[str], timeout: float = 60) -> dict[str, tuple[str, int | None]]:
        """{array task id: (state, exit code or None)}: squeue for live and recent jobs, sacct for the rest.
        Raises subprocess.TimeoutExpired when either takes longer than `timeout` seconds."""
        masters = sorted({j.split("_")[0] for j in job_ids})
        out: dict[str, tuple[str, int | None]] = {}
        if not masters:
            return out
        for chunk in range(0, len(masters), 200):
            ids = ",".join(masters[chunk:chunk + 200])
            r = _run(["squeue", "-h", "-r", "-t", "all", "-j", ids, "-o", "%i|%T"], timeout)
            for line in r.stdout.splitlines() if r.returncode == 0 else []:
                jid, _, state = line.partition("|")
                out[jid.strip()] = (state.strip().split()[0], None)
        need = [j for j in job_ids if j not in out or out[j][0] not in ALIVE]
        if need and shutil.which("sacct"):
            want = sorted({j.split("_")[0] for j in need})
            for chunk in range(0, len(want), 200):
                r = _run(["sacct", "-X", "-n", "-P", "-o", "JobID,State,ExitCode", "-j", ",".join(want[chunk:chunk + 200])],
                         timeout)
                for line in r.stdout.splitlines() if r.returncode == 0 else []:
                    parts = line.split("|")
                    if len(parts) < 3 or "[" in parts[0]:
                        continue  # "12_[3-9]": tasks not started yet, squeue covers them
                    state = parts[1].split()[0]  # "CANCELLED by 0" → CANCELLED
                    if parts[0] in out and out[parts[0]][0] in ALIVE and state not in ALIVE:
                        continue  # squeue is fresher for a job it still lists as alive
                    out[parts[0]] = (state, _exit_code(parts[2]))
        return out


def end_reason(state: str) -> str | None:
    """How a Slurm job state ends an attempt for the driver (cancelled | lost | exited); None while it lives."""
    if state in ALIVE:
        return None
    return "cancelled" if state == "CANCELLED" else "lost" if state in LOST else "exited"


def _exit_code(field: str) -> int | None:
    code, _, sig = field.partition(":")
    try:
        return -int(sig) if sig and int(sig) else int(code)
    except ValueError:
        return None


def wait_accepted(store, submission_id: str, timeout: float = 300) -> list[str]:
    """For `dpx submit` on Slurm: block until the driver's sbatch calls went through (every trial of the submission
    has a job id, or has already ended) and return the array job ids."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        rows = store.trials(submission=submission_id)
        waiting = [r for r in rows if r["status"] == "pending" or (r["status"] == "running" and (
            not r["backend_job_id"] or r["backend_job_id"] == QUEUED))]
        sub = store.submission(submission_id)
        if not waiting or not driver_alive(sub):
            return sorted({(r["backend_job_id"] or "").split("_")[0] for r in rows
                           if r["backend_job_id"] and JOB_ID.match(r["backend_job_id"])})
        time.sleep(0.3)
    return []
