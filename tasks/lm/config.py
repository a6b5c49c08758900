"""Recipe section `task:` of the language-modelling tasks (`lm`, `lm_eval`, `extrapolation`, `effective_rank`) and
of `throughput`. Torch-free and numpy-free: the orchestrator imports it to validate recipes.

One trial = one model. `lm` trains it on a text source (the paper's protocol: AdamW 0.9/0.95, wd 0.01, lr 3e-4,
512 warm-up steps, cosine to 0.1x, clip 1.0, bf16 autocast, a fixed token budget per optimizer step) and then runs
the evaluations named in `evals`. `lm_eval`, `extrapolation` and `effective_rank` are the same task with that one
evaluation switched on; given `checkpoint` they skip training and evaluate a saved model.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from dpx.models.config import ModelConfig, did_you_mean
from dpx.models.choices import Choices, check_choices
from dpx.tasks.training.config import Precision

# Named text sources: hub data sets of the paper (downloaded lazily with `datasets`) and offline stand-ins that
# ship with dpx or are made by it (see sources.py for what each one is).
HubDataset = Literal["fineweb", "fineweb_100bt", "codeparrot", "trivia_qa", "openthoughts_math", "slimpajama"]
BuiltinDataset = Literal["botchan", "pystdlib", "chatterbot_qa", "math_synth", "mixed"]
Dataset = Literal[HubDataset, BuiltinDataset, "local"]
TextFormat = Literal["auto", "text", "content", "trivia", "math"]
Eval = Literal["lm_eval", "extrapolation", "effective_rank"]
LMEvalTask = Literal["wikitext", "lambada_openai", "piqa", "hellaswag", "winogrande", "arc_easy", "arc_challenge"]
LMTaskName = Literal["lm", Eval]
Impl = Literal["dpx", "fla"]
Scope = Literal["model", "layer"]
HUB_DATASETS, BUILTIN_DATASETS, DATASETS = get_args(HubDataset), get_args(BuiltinDataset), get_args(Dataset)
TEXT_FORMATS, EVALS, LM_EVAL_TASKS = get_args(TextFormat), get_args(Eval), get_args(LMEvalTask)
TOKENIZER_VOCAB = {"mistral_v1": 32000, "byte": 259}
TOKENIZERS = tuple(TOKENIZER_VOCAB)  # the shipped ones; `tokenizer:` may also be a path to a .model file


@dataclass
class LMEvalOptions(Choices):
    """lm-evaluation-harness, zero-shot, the paper's Table 3 columns."""
    __pydantic_config__ = {"extra": "forbid"}

    tasks: list[LMEvalTask] = field(default_factory=lambda: list(LM_EVAL_TASKS))
    """harness tasks: wikitext, lambada_openai, piqa, hellaswag, winogrande, arc_easy, arc_challenge"""
    local: bool = False
    """run each task on the small look-alike JSONL shipped with dpx (tasks/lm/data/lm_eval_<task>.jsonl; offline
    pipeline test, not a benchmark number)"""
    data_dir: str = ""
    """folder with local copies of the real benchmark files, <task>.jsonl or <task>.parquet with the hub's fields
    (for machines without the hub); '' uses the hub"""
    limit: int = 0
    """documents per task (0: all)"""
    batch_size: int = 16
    max_length: int = 0
    """window of wikitext's rolling log-likelihood and the longest scored input; 0: the training context_len"""
    add_bos: bool = False
    """prepend <s> to every context (HFLM's default for the Mistral tokenizer is no; the empty-context and
    rolling-window prefix token is <s> either way)"""
    carry_state: bool = False
    """wikitext's rolling log-likelihood carries the recurrent state from window to window (the exact
    whole-document likelihood); false: the harness's disjoint windows of max_length tokens (HFLM, the paper)"""

    def __post_init__(self):
        check_choices(self, "lm_eval.")
        if self.limit < 0 or self.batch_size < 1 or self.max_length < 0:
            raise ValueError("lm_eval.batch_size: must be >= 1 (limit, max_length >= 0)")


@dataclass
class ExtrapolationOptions(Choices):
    """Per-position next-token loss on long sequences (Fig. 8; appendix to 32,768)."""
    __pydantic_config__ = {"extra": "forbid"}

    datasets: list[Dataset] = field(default_factory=lambda: ["codeparrot", "trivia_qa", "openthoughts_math"])
    """text sources (names as in `dataset`); each gives the curve loss_at_pos/<name>"""
    data_files: dict = field(default_factory=dict)
    """local files per data set name, e.g. {codeparrot: [/data/cp.parquet]} (instead of the hub)"""
    max_len: int = 32768
    """evaluated sequence length (the paper: 16,384 and 32,768)"""
    num_sequences: int = 8
    """sequences of max_len tokens averaged per position"""
    batch_size: int = 2
    window: int = 501
    """moving-average window of the plotted curve (the paper: 501 tokens)"""

    def __post_init__(self):
        check_choices(self, "extrapolation.")
        if self.max_len < 2 or self.num_sequences < 1 or self.batch_size < 1 or self.window < 1:
            raise ValueError("extrapolation.max_len: must be >= 2 (num_sequences, batch_size, window >= 1)")


@dataclass
class EffectiveRankOptions(Choices):
    """Effective rank exp(H(sigma / |sigma|_1)) of every head's state along one sequence (Fig. 9)."""
    __pydantic_config__ = {"extra": "forbid"}

    dataset: Dataset = "trivia_qa"
    """text source of the sequence (the paper: trivia_qa, codeparrot)"""
    data_files: list[str] = field(default_factory=list)
    seq_len: int = 16384
    """tokens of the sequence (the paper: 16,384)"""
    layers: list[int] = field(default_factory=list)
    """layers to analyse ([]: all; negative counts from the end)"""
    heads: list[int] = field(default_factory=list)
    """heads to plot ([]: all; the paper plots 4 of 8)"""
    stride: int = 1
    """record every stride-th token (1: every token, as the paper)"""

    def __post_init__(self):
        check_choices(self, "effective_rank.")
        if self.seq_len < 2 or self.stride < 1:
            raise ValueError("effective_rank.seq_len: must be >= 2 (stride >= 1)")


@dataclass
class LMConfig(Choices):
    """Language modelling: documents tokenised with <s>, packed into context_len-token sequences, shuffled by
    seed, trained with the shared loop; then the evaluations in `evals`."""
    __pydantic_config__ = {"extra": "forbid"}

    name: LMTaskName = "lm"
    dataset: Dataset = "botchan"
    """fineweb (HuggingFaceFW/fineweb sample-10BT), fineweb_100bt, codeparrot, trivia_qa, openthoughts_math,
    slimpajama (hub, need network or a cache); botchan, pystdlib, chatterbot_qa, math_synth, mixed (offline);
    local (only data_files)"""
    data_files: list[str] = field(default_factory=list)
    """local Parquet / JSONL / .txt files; with a hub data set name they replace the download (same formatting)"""
    text_format: TextFormat = "auto"
    """auto (the data set's own) | text (field `text`) | content (`content`) | trivia ("Question: {query}, Answer:
    {answer}") | math ("Problem: {problem}, Solution: {solution}")"""
    tokenizer: str = "mistral_v1"
    """mistral_v1 (32,000 pieces, shipped) | byte (259 ids: 3 specials + 256 bytes) | a path to a .model file"""
    context_len: int = 2048
    """tokens per training sequence (the paper: 2048 / 4096)"""
    tokens_per_step: int = 0
    """tokens per optimizer step (the paper: 524,288); sets train.batch_size = tokens_per_step / context_len.
    0: use train.batch_size"""
    micro_batch_size: int = 0
    """sequences per forward pass; sets train.grad_accum = batch_size / micro_batch_size. 0: use train.grad_accum"""
    shuffle_buffer: int = 1024
    """sequences in the seeded shuffle buffer (flame's streaming shuffle); 0: no shuffling beyond document order"""
    val_fraction: float = 0.01
    """documents held out for validation (finite sources: chosen by a seeded permutation, seed val_seed)"""
    val_seed: int = 2357
    """seed of the validation split (the authors' 2357)"""
    val_docs: int = 200
    """documents taken from the head of a hub stream for validation when the data set has no validation split"""
    val_sequences: int = 16
    """validation sequences of context_len tokens (val/loss, val/ppl)"""
    max_docs: int = 0
    """read at most this many documents per pass (0: all)"""
    memory_gb: float = 0.0
    """memory the trial may use; a context length / micro-batch whose estimate exceeds it is refused before
    training. 0: the device's memory (CUDA) or no check (CPU)"""
    evals: list[Eval] = field(default_factory=list)
    """evaluations after training: lm_eval, extrapolation, effective_rank"""
    checkpoint: str = ""
    """evaluate this saved model (a save_pretrained folder, or an lm trial's run dir) instead of training"""
    save_model: bool = True
    """write the trained model to checkpoints/model/ (safetensors + config.json)"""
    size: str = ""
    """paper size label of this row (213M, 392M, 805M), for the registry; '' lets num_params decide"""
    matching: str = ""
    """parameter-matching mode of this row (head_dim: Table 3, heads: Table 4), for the registry"""
    peak_tflops: float = 0.0
    """device peak bf16 TFLOP/s for MFU (0: known GPUs by name, else no MFU)"""
    lm_eval: LMEvalOptions = field(default_factory=LMEvalOptions)
    extrapolation: ExtrapolationOptions = field(default_factory=ExtrapolationOptions)
    effective_rank: EffectiveRankOptions = field(default_factory=EffectiveRankOptions)

    def __post_init__(self):
        for k, cls in (("lm_eval", LMEvalOptions), ("extrapolation", ExtrapolationOptions),
                       ("effective_rank", EffectiveRankOptions)):
            if isinstance(getattr(self, k), dict):
                setattr(self, k, cls(**getattr(self, k)))
        check_choices(self)
        if self.dataset == "local" and not self.data_files:
            raise ValueError("data_files: dataset 'local' needs at least one file")
        if self.tokenizer not in TOKENIZERS and not self.tokenizer.endswith(".model"):
            raise ValueError(f"tokenizer: must be {' or '.join(TOKENIZERS)} or a path to a SentencePiece .model "
                             f"file, got {self.tokenizer!r}{did_you_mean(self.tokenizer, TOKENIZERS)}")
        if self.context_len < 2:
            raise ValueError(f"context_len: must be >= 2, got {self.context_len}")
        if self.tokens_per_step < 0 or self.micro_batch_size < 0:
            raise ValueError("tokens_per_step: must be >= 0 (micro_batch_size too)")
        if self.tokens_per_step and self.tokens_per_step % self.context_len:
            raise ValueError(f"tokens_per_step: {self.tokens_per_step} is not a multiple of context_len "
                             f"{self.context_len}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"val_fraction: must be in [0, 1), got {self.val_fraction}")
        for k in ("shuffle_buffer", "val_docs", "max_docs"):
            if getattr(self, k) < 0:
                raise ValueError(f"{k}: must be >= 0, got {getattr(self, k)}")
        if self.val_sequences < 1:
            raise ValueError(f"val_sequences: must be >= 1, got {self.val_sequences}")
        if self.memory_gb < 0 or self.peak_tflops < 0:
            raise ValueError("memory_gb: must be >= 0 (peak_tflops too)")
        # the eval-only task names switch their evaluation on
        if self.name in EVALS and self.name not in self.evals:
            self.evals = [*self.evals, self.name]

    def check_model(self, model: dict) -> None:
        """Recipe-time cross-check (dpx expand / submit, orchestrator/trials.py): the tokenizer's ids must match
        the model's vocabulary, so a mismatch is one line before any trial starts (run() checks again)."""
        check_vocab({"tokenizer": self.tokenizer}, model)


# The eval-only task names: LMConfig with another `name` (its __pydantic_config__, extra keys forbidden, is inherited).
@dataclass
class LMEvalConfig(LMConfig):
    """lm-evaluation-harness on a model (trained here first unless `checkpoint` is set)."""
    name: LMTaskName = "lm_eval"


@dataclass
class ExtrapolationConfig(LMConfig):
    """Per-position loss up to extrapolation.max_len (trained here first unless `checkpoint` is set)."""
    name: LMTaskName = "extrapolation"


@dataclass
class EffectiveRankConfig(LMConfig):
    """Effective rank of every head's state (trained here first unless `checkpoint` is set)."""
    name: LMTaskName = "effective_rank"


@dataclass
class ThroughputConfig(Choices):
    """Training tokens/s (forward + backward + AdamW step) of one model at one (seq_len x batch) shape, on random
    tokens (Fig. 4). A grid zips seq_len with batch_size at a fixed tokens per batch."""
    __pydantic_config__ = {"extra": "forbid"}

    name: str = "throughput"
    seq_len: int = 2048
    batch_size: int = 8
    warmup_steps: int = 3
    """untimed steps first (Triton autotuning, allocator warm-up)"""
    steps: int = 10
    """timed steps"""
    impl: Impl = "dpx"
    """dpx (our mixer) | fla (fla's GatedDeltaProduct layer in the same LM wrapper; needs fla-core)"""
    scope: Scope = "model"
    """model (the whole LM: embedding, blocks, head, loss, optimizer) | layer (one mixer, forward + backward)"""
    precision: Precision = "auto"
    """auto (bf16 autocast on CUDA, fp32 on CPU) | bf16 | fp32"""
    memory_gb: float = 0.0
    """refuse shapes whose estimate exceeds this (0: the device's memory on CUDA, no check on CPU)"""
    matching: str = ""
    """parameter-matching mode of this row (heads | head_dim), for the registry and the plot"""
    peak_tflops: float = 0.0
    """device peak bf16 TFLOP/s for MFU (0: known GPUs by name)"""

    def __post_init__(self):
        for k in ("seq_len", "batch_size", "steps"):
            if getattr(self, k) < 1:
                raise ValueError(f"{k}: must be >= 1, got {getattr(self, k)}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps: must be >= 0, got {self.warmup_steps}")
        check_choices(self)


def check_vocab(task: dict, model: dict) -> None:
    """A tokenizer whose ids do not fit the model's embedding is a config error ("model.vocab_size: ...")."""
    tok = task.get("tokenizer", LMConfig.tokenizer)
    need = TOKENIZER_VOCAB.get(tok)
    have = (model or {}).get("vocab_size", ModelConfig.vocab_size)  # the defaults: the config classes'
    if need is not None and have != need:
        raise ValueError(f"model.vocab_size: {have} does not match tokenizer {tok} ({need} ids); "
                         f"set model.vocab_size: {need}")
