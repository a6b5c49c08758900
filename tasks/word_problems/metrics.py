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
    """Prefix accuracy over every sequence, `batch_size` at a time; a batch that runs out of GPU memory is split in
    halves (down to one sequence) and the rest goes on at the smaller size. The test length is several times the
    training length, so a batch that trained fits may not evaluate: Mamba's per-channel decays on the PyTorch chunk
    path asked for 18 GiB at 512 x 128 (baselines_state_tracking gpu_small, trials sharing one H200), and the trial
    failed after training had finished. The counts are per sequence, so the result does not depend on the split."""
    acc = PrefixAccuracy()
    i = 0
    while i < len(inputs):
        x = torch.from_numpy(inputs[i:i + batch_size]).to(device)
        y = torch.from_numpy(labels[i:i + batch_size]).to(device)
        try:
            logits = model(x)
        except torch.OutOfMemoryError:
            if batch_size == 1:
                raise
            del x, y
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            batch_size = max(1, batch_size // 2)
            print(f"[dpx] evaluation out of GPU memory: batches of {batch_size} from here", flush=True)
            continue
        acc.update(logits, y)
        i += len(x)
    return acc
