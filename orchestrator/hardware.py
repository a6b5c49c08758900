"""Recipe section `hardware:`: where and how trials run. Never part of a trial's identity (same config on another
machine is the same trial)."""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RaySettings(_Strict):
    address: Optional[str] = None
    """unset: start a local Ray instance sized from this section; `auto`, `host:port` (GCS) or
    `ray://host:port` (Ray Client): join that cluster (its nodes must see the workspace's run dirs)"""
    num_cpus: Optional[int] = None
    """CPUs of the local instance (default: the machine's)"""
    num_gpus: Optional[int] = None
    """GPUs of the local instance (default: the machine's)"""
    memory_gb_per_trial: Optional[float] = None
    """Ray memory resource per trial"""


class SlurmSettings(_Strict):
    partition: Optional[str] = None
    time_min: int = 60
    """wall-time limit per array task; on timeout the trial checkpoints and is requeued"""
    array_parallelism: int = 64
    """array tasks running at once"""
    mem_gb: Optional[float] = None
    max_num_timeout: int = 3
    """requeues on timeout/preemption before the trial is failed"""
    additional_parameters: dict = Field(default_factory=dict)
    """extra sbatch options, e.g. {account: abc, qos: high}"""
    setup: list[str] = Field(default_factory=list)
    """shell lines run before each task (module load ..., source venv)"""
    folder: Optional[str] = None
    """submitit log folder (default: <workspace>/slurm)"""
    signal_delay_s: int = 90
    """Slurm sends USR2 this long before the time limit: the trial checkpoints and the task is requeued"""

    @model_validator(mode="after")
    def _check(self):
        if self.time_min < 1:
            raise ValueError("time_min: must be >= 1")
        if self.array_parallelism < 1:
            raise ValueError("array_parallelism: must be >= 1")
        if self.max_num_timeout < 0:
            raise ValueError("max_num_timeout: must be >= 0")
        if self.mem_gb is not None and self.mem_gb <= 0:
            raise ValueError("mem_gb: must be > 0")
        return self


class HardwareConfig(_Strict):
    backend: Literal["local", "ray", "slurm"] = "local"
    """local (process pool on this machine), ray, or slurm (submitit job arrays)"""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto: CUDA when the trial sees a GPU, else CPU"""
    max_parallel: Optional[int] = None
    """trials at once (local default: CPUs / cpus_per_trial, or the GPU count when gpus_per_trial > 0)"""
    cpus_per_trial: float = 1
    gpus_per_trial: float = 0
    nproc_per_trial: Optional[int] = None
    """processes per trial, training data-parallel under torchrun (DDP; NCCL on GPUs, gloo on CPU); default: one
    per GPU when gpus_per_trial > 1, else 1"""
    timeout_min: Optional[float] = None
    """a trial running longer is killed and marked failed"""
    max_retries: int = 0
    """extra attempts for a trial that failed (worker lost, exception, timeout)"""
    threads_per_trial: Optional[int] = None
    """torch intra-op threads in the trial (default: cpus_per_trial)"""
    ray: RaySettings = Field(default_factory=RaySettings)
    slurm: SlurmSettings = Field(default_factory=SlurmSettings)

    @model_validator(mode="after")
    def _check(self):
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
        return self

