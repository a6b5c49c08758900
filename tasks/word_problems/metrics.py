"""Word-problem metrics (the authors' `cumulative_sequence_accuracies`, restated).

acc_at_pos[t] = fraction of sequences whose predictions at positions 0..t are ALL correct (prefix exact match),
so it is non-increasing in t; position 0 is BOS, position t has consumed t group elements.
token_acc = fraction of correct predictions over positions 1..k (BOS excluded: it is given, not predicted).
max_len_acc90 = the largest t with acc_at_pos[t] >= 0.9 (0 when even t = 1 is below).
"""
from __future__ import annotations

import numpy as np
import torch


class PrefixAccuracy:
    """Accumulates prefix-exact-match counts over batches (batches of any size, one fixed length)."""

    def __init__(self):
        self.prefix_correct: torch.Tensor | None = None  # [T] int64, summed over sequences
        self.token_correct = 0
        self.tokens = 0
        self.n = 0

    def update(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        correct = logits.argmax(-1) == labels  # [B, T]
        prefix = torch.cumprod(correct.long(), dim=1).sum(0).cpu()
        self.prefix_correct = prefix if self.prefix_correct is None else self.prefix_correct + prefix
        self.token_correct += int(correct[:, 1:].sum())
        self.tokens += correct[:, 1:].numel()
        self.n += correct.shape[0]

    def acc_at_pos(self) -> np.ndarray:
        """[T] prefix accuracy; index t = positions 0..t correct."""
        return (self.prefix_correct.double() / self.n).numpy()

    def token_acc(self) -> float:
        return self.token_correct / max(self.tokens, 1)


def max_len_at(acc_at_pos: np.ndarray, threshold: float = 0.9) -> int:
    """Largest t >= 1 with acc_at_pos[t] >= threshold (acc_at_pos is non-increasing), 0 if none."""
    ok = np.nonzero(acc_at_pos[1:] >= threshold)[0]
    return int(ok[-1] + 1) if len(ok) else 0


@torch.no_grad()
def evaluate(model, inputs: np.ndarray, labels: np.ndarray, batch_size: int, device) -> PrefixAccuracy:
    acc = PrefixAccuracy()
    for i in range(0, len(inputs), batch_size):
        x = torch.from_numpy(inputs[i:i + batch_size]).to(device)
        y = torch.from_numpy(labels[i:i + batch_size]).to(device)
        acc.update(model(x), y)
    return acc
