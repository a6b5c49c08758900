"""Recipe sections `train:` and `eval:` shared by every training task. Torch-free (the orchestrator imports it
to validate recipes). Field docstrings are the documentation users see."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from dpx.models.choices import Choices, check_choices

Schedule = Literal["cosine", "constant", "linear"]
Precision = Literal["auto", "fp32", "bf16"]
EarlyStopMode = Literal["max", "min"]


@dataclass
class TrainConfig(Choices):
    __pydantic_config__ = {"extra": "forbid"}

    steps: int = 1000
    """optimizer steps (upper bound; early stopping may end sooner)"""
    batch_size: int = 32
    """sequences per optimizer step (split into micro-batches by grad_accum)"""
    grad_accum: int = 1
    """micro-batches per optimizer step"""
    lr: float = 1e-3
    """peak learning rate (AdamW)"""
    min_lr_ratio: float = 0.1
    """cosine decays to lr * min_lr_ratio"""
    warmup_steps: int = 0
    """linear warm-up steps"""
    schedule: Schedule = "cosine"
    """cosine | constant | linear"""
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    """max gradient norm (0 disables)"""
    precision: Precision = "auto"
    """auto (bf16 autocast on CUDA, fp32 on CPU) | fp32 | bf16"""
    eval_every: int = 100
    """steps between validation passes"""
    log_every: int = 10
    """steps between logged training metrics"""
    checkpoint_every: int = 200
    """steps between checkpoints (0: only on preemption and at the end)"""
    early_stop_metric: str = ""
    """validation metric that ends training when it reaches early_stop_value ('' disables)"""
    early_stop_value: float = 1.0
    """threshold of early_stop_metric"""
    early_stop_mode: EarlyStopMode = "max"
    """max: stop when the metric is >= early_stop_value; min: when it is <= (e.g. a validation loss)"""
    max_time_s: float = 0.0
    """stop training after this many seconds of training steps (0: no limit), not counting each attempt's first step:
    on a GPU that step compiles and autotunes the kernels (13-31 s for the delta family's Triton kernels on the
    H200, 1-3 s for a Transformer), so a time box that counted it gave architectures unequal training time"""
    compile: bool = False
    """torch.compile the model (the delta kernels run as custom ops inside the graph)"""
    compile_scope: Literal["blocks", "model"] = "blocks"
    """with compile: blocks = each layer block compiled on its own, one graph shared by the identical blocks (compile
    time about 1/num_layers of model's: 89 s against 290 s for 8 layers, CPU); model = the whole model as one graph"""

    def __post_init__(self):
        for k in ("steps", "batch_size", "grad_accum"):
            if getattr(self, k) < 1:
                raise ValueError(f"{k}: must be >= 1, got {getattr(self, k)}")
        if self.lr <= 0:
            raise ValueError(f"lr: must be > 0, got {self.lr}")
        check_choices(self)
        for k in ("warmup_steps", "eval_every", "log_every", "checkpoint_every"):
            if getattr(self, k) < 0:
                raise ValueError(f"{k}: must be >= 0, got {getattr(self, k)}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio: must be in [0, 1], got {self.min_lr_ratio}")
        if self.grad_clip < 0:
            raise ValueError(f"grad_clip: must be >= 0 (0 disables), got {self.grad_clip}")
        if self.batch_size % self.grad_accum:
            raise ValueError(f"grad_accum: {self.grad_accum} does not divide batch_size {self.batch_size}")
        self.betas = tuple(self.betas)


@dataclass
class EvalConfig:
    __pydantic_config__ = {"extra": "forbid"}

    batch_size: int = 64
    """sequences per evaluation batch"""
    num_samples: int = 1000
    """evaluation sequences (synthetic tasks)"""
    probe: bool = False
    """run the task's interpretability probe after training (word problems: Fig. 7 beta / key-PCA probe)"""
    probe_samples: int = 256
    """sequences fed through the model by the probe"""
    extra: dict = field(default_factory=dict)
    """task-specific evaluation options"""

    def __post_init__(self):
        if self.batch_size < 1:
            raise ValueError(f"batch_size: must be >= 1, got {self.batch_size}")
        if self.num_samples < 1:
            raise ValueError(f"num_samples: must be >= 1, got {self.num_samples}")
        if self.probe_samples < 1:
            raise ValueError(f"probe_samples: must be >= 1, got {self.probe_samples}")
