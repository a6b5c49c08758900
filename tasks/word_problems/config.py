"""Config of the `word_problem` task (recipe section `task:`): group word problems S3, S4, A5, S5.

Torch-free and numpy-free (the orchestrator imports it to validate recipes).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from dpx.models.choices import Choices, check_choices

Group = Literal["S3", "S4", "A5", "S5"]
GROUP_ORDERS: dict[Group, int] = {"S3": 6, "S4": 24, "A5": 60, "S5": 120}
assert tuple(GROUP_ORDERS) == get_args(Group)
NUM_SPECIAL = 7
"""the authors' tokenizer appends [PAD] [BOS] [UNK] [EOS] [SEP] [CLS] [MASK] after the |G| element tokens"""


@dataclass
class WordProblemConfig(Choices):
    """Input [BOS, x_1..x_k], labels [BOS, y_1..y_k] with y_t = x_1 * ... * x_t; token id = element index,
    PAD = |G|, BOS = |G| + 1 (the authors' tokenizer). Sequences are drawn on the fly from the trial seed."""

    __pydantic_config__ = {"extra": "forbid"}

    name: str = "word_problem"
    group: Group = "S3"
    """S3 | S4 | A5 | S5"""
    train_len: int = 128
    """word length k during training (the paper: 128)"""
    test_len: int = 512
    """word length of the test set (the paper: 512); accuracy is reported at every position up to it"""
    num_train_samples: int = 0
    """0: fresh random words every step; N > 0: a fixed pool of N words, reshuffled every epoch (the paper: 2,000,000)"""
    val_samples: int = 512
    """validation words at train_len (early stopping looks at these)"""
    cache_dir: str = ""
    """optional folder where generated word pools and test sets are kept as .npy for reuse ('' disables)"""

    def __post_init__(self):
        check_choices(self)
        for k in ("train_len", "test_len", "val_samples"):
            if getattr(self, k) <= 0:
                raise ValueError(f"{k}: must be > 0, got {getattr(self, k)}")
        if self.test_len < self.train_len:
            raise ValueError(f"test_len: {self.test_len} is shorter than train_len {self.train_len}")
        if self.num_train_samples < 0:
            raise ValueError(f"num_train_samples: must be >= 0, got {self.num_train_samples}")

    @property
    def num_elements(self) -> int:
        return GROUP_ORDERS[self.group]

    @property
    def pad_id(self) -> int:
        return self.num_elements

    @property
    def bos_id(self) -> int:
        return self.num_elements + 1

    @property
    def vocab_size(self) -> int:
        """The authors' vocabulary size, |G| + 7 (S3: 13, S4: 31, A5: 67, S5: 127)."""
        return self.num_elements + NUM_SPECIAL

    def check_model(self, model: dict) -> None:
        """Cross-check against the model section: its vocabulary must hold every token id this task emits."""
        v = model.get("vocab_size")
        if v is not None and int(v) < self.bos_id + 1:
            raise ValueError(f"model.vocab_size: {v} cannot hold the {self.group} word problem's tokens "
                             f"(needs >= {self.bos_id + 1}; the authors use {self.vocab_size})")
