"""Recipe section `hardware:`: where and how trials run. Never part of a trial's identity (same config on another
machine is the same trial).

Stdlib dataclasses with a docstring per field, validated by pydantic (`__pydantic_config__`: unknown keys are
errors) through the recipe loader (trials.py), like the model, task and train sections; each checks itself in
`__post_init__`, raising ValueError("key: reason"). The driver and the backends get these objects
(`HardwareConfig.of(trial_config)`), not the raw dict. Stdlib only.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal, Optional


@dataclass
class RaySettings:
    __pydantic_config__ = {"extra": "forbid"}

    address: Optional[str] = None
    """unset: start a local Ray instance sized from this section; `auto`, `host:port` (GCS) or
    `ray://host:port` (Ray Client): join that cluster (its nodes must see the workspace's run dirs)"""
    num_cpus: Optional[int] = None
    """CPUs of the local instance (default: the machine's)"""
    num_gpus: Optional[int] = None
    """GPUs of the local instance (default: the machine's)"""
    memory_gb_per_trial: Optional[float] = None
    """Ray memory resource per trial"""


@dataclass
class SlurmSettings:
    __pydantic_config__ = {"extra": "forbid"}

    partition: Optional[str] = None
    time_min: int = 60
    """wall-time limit per array task; on timeout the trial checkpoints and is requeued"""
    array_parallelism: int = 64
    """array tasks running at once"""
    mem_gb: Optional[float] = None
    max_num_timeout: int = 3
    """requeues on timeout/preemption before the trial is failed"""
    additional_parameters: dict = field(default_factory=dict)
    """extra sbatch options, e.g. {account: abc, qos: high}"""
    setup: list[str] = field(default_factory=list)
    """shell lines run before each task (module load ..., source venv)"""
    folder: Optional[str] = None
    """submitit log folder (default: <workspace>/slurm)"""
    signal_delay_s: int = 90
    """Slurm sends USR2 this long before the time limit: the trial checkpoints and the task is requeued"""

    def __post_init__(self):
        if self.time_min < 1:
            raise ValueError("time_min: must be >= 1")
        if self.array_parallelism < 1:
            raise ValueError("array_parallelism: must be >= 1")
        if self.max_num_timeout < 0:
            raise ValueError("max_num_timeout: must be >= 0")
        if self.mem_gb is not None and self.mem_gb <= 0:
            raise ValueError("mem_gb: must be > 0")


@dataclass
class HardwareConfig:
    __pydantic_config__ = {"extra": "forbid"}

    backend: Literal["local", "ray", "slurm"] = "local"
    """local (process pool on this machine), ray, or slurm (submitit job arrays)"""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto: CUDA when the trial sees a GPU, else CPU"""
    max_parallel: Optional[int] = None
    """trials at once (local default: CPUs / cpus_per_trial, or what the GPUs hold when gpus_per_trial > 0; on
    the local backend never more than the GPUs hold: a trial never starts without its GPUs)"""
    cpus_per_trial: float = 1
    gpus_per_trial: float = 0
    """GPUs a trial gets; below 1, trials share a GPU (0.25: four a GPU, local and Ray), 1 or more: whole GPUs"""
    nproc_per_trial: Optional[int] = None
    """processes per trial, training data-parallel under torchrun (DDP; NCCL on GPUs, gloo on CPU); default: one
    per GPU when gpus_per_trial > 1, else 1"""
    timeout_min: Optional[float] = None
    """a trial running longer is killed and marked failed"""
    max_retries: int = 0
    """extra attempts for a trial that failed (worker lost, exception, timeout)"""
    threads_per_trial: Optional[int] = None
    """torch intra-op threads in the trial (default: cpus_per_trial)"""
    ray: RaySettings = field(default_factory=RaySettings)
    slurm: SlurmSettings = field(default_factory=SlurmSettings)

    def __post_init__(self):
        if self.cpus_per_trial <= 0:
            raise ValueError("cpus_per_trial: must be > 0")
        if self.gpus_per_trial < 0:
            raise ValueError("gpus_per_trial: must be >= 0")
        if self.nproc_per_trial is not None and self.nproc_per_trial < 1:
            raise ValueError("nproc_per_trial: must be >= 1")
        if self.max_parallel is not None and self.max_parallel < 1:
            raise ValueError("max_parallel: must be >= 1")
        if self.max_retries < 0:
            raise ValueError("max_retries: must be >= 0")
        if self.timeout_min is not None and self.timeout_min <= 0:
            raise ValueError("timeout_min: must be > 0")

    @property
    def threads(self) -> int:
        """torch intra-op threads (OMP_NUM_THREADS) of a trial: threads_per_trial, else its whole CPUs."""
        return self.threads_per_trial or max(1, int(float(self.cpus_per_trial or 1)))

    @property
    def timeout_s(self) -> float | None:
        """timeout_min in seconds, None for no limit."""
        return self.timeout_min * 60 if self.timeout_min else None

    @classmethod
    def of(cls, config: dict) -> HardwareConfig:
        """The hardware section of a resolved trial config (validated when its recipe was expanded; keys another
        dpx version wrote and this one lacks are dropped)."""
        d = known_fields(cls, config.get("hardware"))
        return cls(**{**d, "ray": RaySettings(**known_fields(RaySettings, d.get("ray"))),
                      "slurm": SlurmSettings(**known_fields(SlurmSettings, d.get("slurm")))})


def known_fields(cls: type, d: dict | None) -> dict:
    """The items of `d` that name fields of the dataclass `cls`."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in (d or {}).items() if k in names}
