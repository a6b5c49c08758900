"""Data-parallel trials, launcher side: a trial with `hardware.gpus_per_trial > 1` (or `hardware.nproc_per_trial
> 1`, gloo on CPU) re-runs the runner under torchrun, one process per GPU; the runner's ranks then train with
DistributedDataParallel (tasks/training/distributed.py) and rank 0 alone writes the run dir.

Stdlib only: the runner imports this on a bare GPU node.

- The launcher (the process the backend started) waits for torchrun and returns the runner's exit code (0
  completed, 3 preempted, 1 failed), read off the run dir rank 0 wrote; when no rank got as far as writing
  one, it writes error.json itself with the tail of the log.
- SIGTERM/SIGUSR1 to the launcher reach the ranks as one SIGTERM through torchrun (torchrun and its workers run
  in their own sessions, so a process-group signal would miss them): the ranks agree on the step, rank 0
  checkpoints, and the launcher returns 3 (preempted).
- torchrun dies with the launcher and the ranks with torchrun (PR_SET_PDEATHSIG), so a killed trial leaves no
  orphan holding a GPU.
"""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# NVLink multicast (NVLS) can put a host's shared GPUs out of service: kept off in everything dpx starts.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def set_safe_env(env: dict | None = None) -> dict:
    """Put SAFE_ENV into `env` (default os.environ) unless the caller already chose a value."""
    env = os.environ if env is None else env
    for k, v in SAFE_ENV.items():
        env.setdefault(k, v)
    return env


def nproc_per_trial(hw: dict) -> int:
    """Processes per trial: hardware.nproc_per_trial when set, else one per GPU when gpus_per_trial > 1."""
    n = hw.get("nproc_per_trial")
    if n:
        return int(n)
    g = float(hw.get("gpus_per_trial") or 0)
    return int(math.ceil(g)) if g > 1 else 1


def in_worker() -> bool:
    """True inside a rank that torchrun started (it sets LOCAL_RANK and WORLD_SIZE)."""
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies (Linux; a no-op elsewhere)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def launch(run_dir: Path, attempt: int, nproc: int) -> int:
    """Run the trial as `nproc` ranks under torchrun; return 0 completed, 3 preempted, 1 failed."""
    run_dir = Path(run_dir)
    for stale in ("result.json", "error.json"):
        (run_dir / stale).unlink(missing_ok=True)
    env = set_safe_env(dict(os.environ))
    env.pop("LOCAL_RANK", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "dpx.orchestrator.runner", str(run_dir), "--attempt", str(attempt)]
    print(f"[dpx] data-parallel trial: {nproc} processes ({' '.join(cmd[1:6])})", flush=True)
    started = time.time()
    # its own session: a signal to the trial's process group reaches torchrun once, through forward()
    proc = subprocess.Popen(cmd, env=env, cwd=str(run_dir), stdin=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=die_with_parent)
    sent = []

    def forward(signum, frame):  # torchrun turns one SIGTERM into SIGTERM to every rank, then waits for them
        if not sent:
            sent.append(signum)
            try:
                proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        code = proc.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if (run_dir / "result.json").exists():
        return 0
    err = run_dir / "error.json"
    if err.exists():
        try:
            return 3 if json.loads(err.read_text()).get("status") == "preempted" else 1
        except ValueError:
            return 1
    tail = ""
    log = run_dir / "log.txt"
    if log.exists():
        tail = log.read_bytes()[-4000:].decode(errors="replace")
    from dpx.rundir import atomic_write_json

    atomic_write_json(err, {"trial_id": run_dir.name, "status": "failed", "attempt": attempt, "pid": os.getpid(),
                            "error": f"torchrun exited with {code} before any rank wrote a result ({nproc} ranks)",
                            "traceback": tail, "started_at": started, "ended_at": time.time()})
    return 1
