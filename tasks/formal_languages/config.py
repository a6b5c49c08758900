"""Config of the `formal_language` task (recipe section `task:`): parity and modular arithmetic without / with
brackets in the DeltaNet / DeltaProduct next-token framing (Grazzi et al.'s xLSTM-repo variant, paper Table 2).
Torch-free."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from dpx.models.choices import Choices, check_choices

Language = Literal["parity", "mod_arith", "mod_arith_brackets"]
LANGUAGES = get_args(Language)


@dataclass
class FormalLanguageConfig(Choices):
    """A sample is a prompt whose last token must be followed by the answer token; the loss and the accuracy are
    taken at that one position, over the model's whole vocabulary. Lengths count every token incl. the answer."""

    __pydantic_config__ = {"extra": "forbid"}

    name: str = "formal_language"
    language: Language = "parity"
    """parity | mod_arith (no brackets) | mod_arith_brackets"""
    train_min_len: int = 3
    """shortest training sample (the paper: 3)"""
    train_max_len: int = 40
    """longest training sample (the paper: 40)"""
    test_min_len: int = 40
    """shortest test sample (the paper: 40)"""
    test_max_len: int = 256
    """longest test sample (the paper: 256)"""
    modulus: int = 5
    """modulus of the arithmetic languages (the paper: 5)"""
    brackets_mult: bool = False
    """allow '*' in mod_arith_brackets (the reference configs leave it off: only + and -)"""
    val_samples: int = 1024
    """validation samples at training lengths (what early stopping sees)"""

    def __post_init__(self):
        check_choices(self)
        for k in ("train_min_len", "train_max_len", "test_min_len", "test_max_len", "val_samples"):
            if getattr(self, k) <= 0:
                raise ValueError(f"{k}: must be > 0, got {getattr(self, k)}")
        if self.train_min_len < 3:
            raise ValueError(f"train_min_len: a sample needs at least 3 tokens (prompt, '=' or bit, answer), "
                             f"got {self.train_min_len}")
        if self.train_max_len < self.train_min_len:
            raise ValueError(f"train_max_len: {self.train_max_len} < train_min_len {self.train_min_len}")
        if self.test_max_len < self.test_min_len:
            raise ValueError(f"test_max_len: {self.test_max_len} < test_min_len {self.test_min_len}")
        if self.test_max_len < self.train_max_len:
            raise ValueError(f"test_max_len: {self.test_max_len} is shorter than train_max_len {self.train_max_len}")
        if self.test_min_len < 3:
            raise ValueError(f"test_min_len: must be >= 3, got {self.test_min_len}")
        if self.modulus < 2:
            raise ValueError(f"modulus: must be >= 2, got {self.modulus}")

    @property
    def vocab_size(self) -> int:
        """parity 3 (pad, 0, 1); mod_arith modulus + 5 (pad + - * = digits); brackets modulus + 7
        (digits + - * ( ) = [PAD]): 3 / 10 / 12 for modulus 5, as in the reference configs."""
        return {"parity": 3, "mod_arith": self.modulus + 5, "mod_arith_brackets": self.modulus + 7}[self.language]

    @property
    def num_answers(self) -> int:
        return 2 if self.language == "parity" else self.modulus

    @property
    def chance(self) -> float:
        """c of the scaled accuracy (a - c) / (1 - c): 0.5 for parity, 1/modulus = 0.2 for arithmetic."""
        return 1.0 / self.num_answers

    def check_model(self, model: dict) -> None:
        """Cross-check against the model section: its vocabulary must hold every token id this task emits."""
        v = model.get("vocab_size")
        if v is not None and int(v) < self.vocab_size:
            raise ValueError(f"model.vocab_size: {v} cannot hold the {self.language} tokens (needs >= {self.vocab_size})")
