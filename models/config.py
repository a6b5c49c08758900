"""Recipe section `model:`: which token mixer, its sizes, and how to parameter-match it. Torch-free.

Knob names follow fla's GatedDeltaProduct layer (num_householder, use_forget_gate, allow_neg_eigval,
use_short_conv, conv_size, use_output_gate, num_heads, head_dim, expand_v) so a recipe maps 1:1 onto it. Two
readable aliases exist for recipes, `n_h` and `beta_range`; `__post_init__` folds them into the canonical fields
and sets them to None, so two spellings of the same model hash to the same trial id.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal, get_args

from ..kernels import IMPLS  # the kernels' own list; dpx.kernels imports no torch (its docstring says why)
from .choices import Choices, check_choices, did_you_mean  # noqa: F401  (did_you_mean: the loader imports it here)
from .family_names import DELTA_FAMILIES, FAMILIES
from .plugins import families

MatchingMode = Literal["none", "heads", "head_dim", "mlp"]
Init = Literal["default", "authors"]
Impl = Literal[IMPLS]  # the kernels' implementations: "auto", "triton", "torch", "naive"
MATCHING_MODES, INITS = get_args(MatchingMode), get_args(Init)
# beta_range names the eigenvalue range of each Householder factor I - beta k k^T (unit k): [0,1] <-> beta in
# [0,1] (sigmoid), [-1,1] <-> beta in [0,2] (2 * sigmoid), the paper's two settings.
BETA_RANGES = {"[0,1]": False, "[-1,1]": True}


@dataclass
class MatchingConfig(Choices):
    """Parameter matching (the paper's "matching mode"): solve one free dimension so the model's total parameter
    count lands within `tolerance` of a reference model."""
    __pydantic_config__ = {"extra": "forbid"}

    mode: MatchingMode = "none"
    """none | heads (trade heads for Householders, then trim hidden_size as the authors did) | head_dim |
    mlp (solve the SwiGLU width)"""
    reference: dict = field(default_factory=dict)
    """the reference model: ModelConfig fields that replace this model's (e.g. {n_h: 1, num_heads: 8})"""
    tolerance: float = 0.01
    """accepted relative difference of total parameters"""
    heads_multiple: int = 2
    """heads mode rounds the head count up to a multiple of this (the authors: 8 -> 6 at n_h=2, 16 -> 12)"""
    hidden_multiple: int = 4
    """heads mode searches hidden_size in steps of this when heads alone miss the tolerance"""

    def __post_init__(self):
        # keys are relative ("mode: ..."): nested under `model.matching` by the recipe loader
        check_choices(self)
        if not isinstance(self.reference, dict):
            raise ValueError(f"reference: must be a mapping of model fields, got {type(self.reference).__name__}")
        if self.mode != "none" and not self.reference:
            raise ValueError("reference: required when mode is not 'none'")
        bad = [k for k in self.reference if k not in MODEL_FIELDS or k == "matching"]
        if bad:
            raise ValueError(f"reference.{bad[0]}: not a model field" + did_you_mean(bad[0], MODEL_FIELDS))
        # aliases -> canonical names here too, so equivalent references hash alike
        ref = dict(self.reference)
        if "n_h" in ref:
            ref["num_householder"] = ref.pop("n_h")
        if "beta_range" in ref:
            try:
                ref["allow_neg_eigval"] = ModelConfig(beta_range=ref.pop("beta_range")).allow_neg_eigval
            except ValueError as e:
                raise ValueError(f"reference.{e}") from None
        self.reference = ref
        if not 0 < self.tolerance < 1:
            raise ValueError(f"tolerance: must be in (0, 1), got {self.tolerance}")
        for k in ("heads_multiple", "hidden_multiple"):
            if getattr(self, k) < 1:
                raise ValueError(f"{k}: must be >= 1, got {getattr(self, k)}")


@dataclass
class ModelConfig(Choices):
    """A language model (or sequence classifier) built from one token-mixer family. See FAMILIES."""
    __pydantic_config__ = {"extra": "forbid"}

    family: str = "deltaproduct"
    """token mixer: linear_attention, retnet, rwkv4, rwkv5, rwkv6, gla, mamba, mamba2, deltanet, gated_deltanet,
    rwkv7, deltaproduct, gated_deltaproduct, transformer"""
    vocab_size: int = 32000
    """input vocabulary (tasks set this from their tokenizer)"""
    num_classes: int | None = None
    """output classes when they differ from the input vocabulary (an untied head); None: next-token LM head"""
    hidden_size: int = 128
    """model width d"""
    num_layers: int = 2
    """number of blocks"""
    num_heads: int = 4
    """heads of the token mixer"""
    head_dim: int | None = None
    """key (and query) dimension per head; None: hidden_size // num_heads (must divide)"""
    expand_v: float = 1.0
    """value dimension per head = head_dim * expand_v"""
    num_householder: int = 1
    """n_h: Householder factors per token (DeltaProduct); 1 for every other family"""
    use_forget_gate: bool | None = None
    """scalar forget gate g_t (Gated DeltaNet/DeltaProduct); None: True for the gated_* families, else False"""
    allow_neg_eigval: bool = False
    """beta = 2*sigmoid (in [0,2], eigenvalues in [-1,1]) instead of sigmoid; delta-rule families and rwkv7"""
    use_short_conv: bool = True
    """depthwise causal convolution (with SiLU) on q, k, v before the mixer"""
    conv_size: int = 4
    """kernel size of the short convolution (also Mamba's conv)"""
    use_output_gate: bool = False
    """multiply the normalised mixer output by SiLU(W_g x) (the authors' LM configs leave it off)"""
    intermediate_size: int | None = None
    """SwiGLU width; None: mlp_ratio * hidden_size * 2/3 rounded up to a multiple of 256 (fla's rule)"""
    mlp_ratio: float = 4.0
    """fla's hidden_ratio, used when intermediate_size is None; 0 disables the MLP (Mamba-style blocks)"""
    norm_eps: float = 1e-6
    """RMSNorm epsilon"""
    init_std: float = 0.006
    """std of the normal init of embeddings and linear weights (authors' initializer_range)"""
    init: Init = "default"
    """default: N(0, init_std) for every Linear and Embedding weight (biases 0), short convs keep their uniform
    +-1/sqrt(conv_size) init | authors: fla 0.2.2's _init_weights as the authors' LM runs had it (prenorm_residual_
    strategy 'rescale'): also the short convs from N(0, init_std), and every o_proj / down_proj weight re-drawn
    from kaiming_uniform(a=sqrt(5)) (U(+-1/sqrt(fan_in))) and divided by sqrt(2 * num_layers)"""
    tie_embeddings: bool = True
    """share the input embedding with the output head (ignored when num_classes is set)"""
    chunk_size: int | None = None
    """tokens per chunk of the chunkwise-parallel form; None: the implementation's default (64 steps)"""
    impl: Impl = "auto"
    """kernel implementation: auto (Triton on CUDA, PyTorch chunkwise on CPU) | triton | torch | naive"""
    state_size: int = 16
    """Mamba / Mamba-2 state size N per channel (per head for Mamba-2)"""
    expand: int = 2
    """Mamba / Mamba-2 inner expansion (d_inner = expand * hidden_size)"""
    low_rank_dim: int = 16
    """rank of the low-rank (LoRA) projections of data-dependent decays and gates (GLA, RWKV-6, RWKV-7)"""
    rope_theta: float = 10000.0
    """RoPE base of the transformer baseline"""
    matching: MatchingConfig = field(default_factory=MatchingConfig)
    """parameter matching against a reference model"""
    n_h: int | None = None
    """alias of num_householder (folded in and reset to None on load)"""
    beta_range: Any = None
    """alias of allow_neg_eigval: eigenvalue range "[0,1]" or "[-1,1]" (folded in and reset to None on load)"""

    def __post_init__(self):
        if self.family not in FAMILIES:
            known = families()  # with the entry-point families of other packages (models/plugins.py)
            if self.family not in known:
                raise ValueError(f"family: unknown family {self.family!r}" + did_you_mean(self.family, known)
                                 + f"; choose one of {', '.join(known)}")
        if isinstance(self.matching, dict):
            unknown = [k for k in self.matching if k not in MATCHING_FIELDS]
            if unknown:
                raise ValueError(f"matching.{unknown[0]}: unknown key" + did_you_mean(unknown[0], MATCHING_FIELDS))
            try:
                self.matching = MatchingConfig(**self.matching)
            except ValueError as e:
                raise ValueError(f"matching.{e}") from None
        # aliases -> canonical fields
        if self.n_h is not None:
            if not isinstance(self.n_h, int) or self.n_h < 1:
                raise ValueError(f"n_h: must be an integer >= 1, got {self.n_h!r}")
            if self.n_h != self.num_householder and self.num_householder != 1:
                raise ValueError(f"n_h: conflicts with num_householder={self.num_householder}")
            self.num_householder, self.n_h = self.n_h, None
        if self.beta_range is not None:
            key = self.beta_range
            if isinstance(key, (list, tuple)):  # YAML reads [-1, 1] as a list
                key = "[" + ",".join(f"{float(x):g}" for x in key) + "]"
            key = str(key).replace(" ", "")
            if key not in BETA_RANGES:
                raise ValueError(f"beta_range: must be [0,1] or [-1,1] (eigenvalue range of I - beta k k^T), "
                                 f"got {self.beta_range!r}")
            self.allow_neg_eigval, self.beta_range = BETA_RANGES[key], None
        gated = self.family in ("gated_deltanet", "gated_deltaproduct")
        if self.use_forget_gate is None:
            self.use_forget_gate = gated
        elif self.family in DELTA_FAMILIES and self.use_forget_gate != gated:
            want = ("gated_" + self.family) if self.use_forget_gate else self.family.replace("gated_", "")
            raise ValueError(f"use_forget_gate: family {self.family} has use_forget_gate={gated}; use family {want}")
        self._check()

    def _check(self):
        if self.num_householder < 1:
            raise ValueError(f"num_householder: must be >= 1, got {self.num_householder}")
        if self.num_householder > 1 and self.family not in ("deltaproduct", "gated_deltaproduct"):
            hint = " (use family deltaproduct / gated_deltaproduct)" if self.family in DELTA_FAMILIES else ""
            raise ValueError(f"num_householder: family {self.family} has one transition factor per token, "
                             f"got {self.num_householder}{hint}")
        for k in ("vocab_size", "hidden_size", "num_layers", "num_heads", "conv_size", "state_size", "expand",
                  "low_rank_dim"):
            if getattr(self, k) < 1:
                raise ValueError(f"{k}: must be >= 1, got {getattr(self, k)}")
        if self.num_classes is not None and self.num_classes < 1:
            raise ValueError(f"num_classes: must be >= 1, got {self.num_classes}")
        if self.head_dim is None and self.hidden_size % self.num_heads:
            raise ValueError(f"head_dim: num_heads={self.num_heads} does not divide hidden_size={self.hidden_size}; "
                             "set head_dim or change num_heads")
        if self.head_dim is not None and self.head_dim < 1:
            raise ValueError(f"head_dim: must be >= 1, got {self.head_dim}")
        dv = self.key_dim * self.expand_v
        if self.expand_v <= 0 or dv != int(dv):
            raise ValueError(f"expand_v: head_dim * expand_v must be a positive integer, got {self.key_dim} * {self.expand_v}")
        if self.family in ("transformer", "retnet") and self.key_dim % 2:
            raise ValueError(f"head_dim: rotary embeddings need an even head_dim, got {self.key_dim}")
        if self.family == "mamba2" and (self.expand * self.hidden_size) % self.num_heads:
            raise ValueError(f"num_heads: {self.num_heads} does not divide mamba2's inner size "
                             f"expand * hidden_size = {self.expand * self.hidden_size}")
        if self.intermediate_size is not None and self.intermediate_size < 1:
            raise ValueError(f"intermediate_size: must be >= 1, got {self.intermediate_size}")
        if self.mlp_ratio < 0:
            raise ValueError(f"mlp_ratio: must be >= 0, got {self.mlp_ratio}")
        if self.norm_eps <= 0 or self.init_std <= 0:
            raise ValueError("norm_eps: must be > 0" if self.norm_eps <= 0 else "init_std: must be > 0")
        if self.chunk_size is not None and self.chunk_size < 1:
            raise ValueError(f"chunk_size: must be >= 1, got {self.chunk_size}")
        check_choices(self)  # init, impl

    # derived sizes -----------------------------------------------------------------------------------------------
    @property
    def key_dim(self) -> int:
        """per-head key/query dimension"""
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_heads

    @property
    def value_dim(self) -> int:
        """per-head value dimension"""
        return int(self.key_dim * self.expand_v)

    @property
    def mlp_size(self) -> int:
        """SwiGLU width actually built (0: no MLP)"""
        if self.intermediate_size is not None:
            return self.intermediate_size
        if self.mlp_ratio == 0:
            return 0
        n = int(self.hidden_size * self.mlp_ratio * 2 / 3)
        return 256 * ((n + 255) // 256)

    @property
    def output_size(self) -> int:
        return self.num_classes if self.num_classes is not None else self.vocab_size

    # (de)serialisation ---------------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = dict(v.__dict__) if isinstance(v, MatchingConfig) else v
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        """Like ModelConfig(**d) but unknown keys are a ValueError naming the key (not a TypeError)."""
        if isinstance(d, cls):
            return d
        unknown = [k for k in d if k not in MODEL_FIELDS]
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown model field" + did_you_mean(unknown[0], MODEL_FIELDS))
        return cls(**d)

    def replace(self, **changes) -> "ModelConfig":
        """A copy with some fields changed, re-validated."""
        d = self.to_dict()
        if changes.get("n_h") is not None:  # an alias in the changes wins over the canonical field
            d["num_householder"] = changes.pop("n_h")
        d.update(changes)
        return ModelConfig.from_dict(d)


MODEL_FIELDS = tuple(f.name for f in fields(ModelConfig))
MATCHING_FIELDS = tuple(f.name for f in fields(MatchingConfig))
