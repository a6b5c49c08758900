"""Word-problem sequences, generated on the fly from a seed (no files; an optional .npy cache).

Every batch is a pure function of (seed, step, micro-batch), which is what makes the training loop's resume exact.
Training words depend on the trial seed; validation and test words come from a fixed data seed, so every trial
of a grid (any model, any seed) is measured on the same words.
"""
from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path

import numpy as np

from dpx.tasks.word_problems import groups
from dpx.tasks.word_problems.config import WordProblemConfig

EVAL_DATA_SEED = 20250214  # fixed: validation/test words are shared by all trials
_TRAIN, _POOL, _PERM, _VAL, _TEST = 0, 1, 2, 3, 4  # independent random streams


def random_words(seed: int, stream: int, index: int, n: int, k: int, num_elements: int) -> np.ndarray:
    rng = np.random.default_rng([seed, stream, index])
    return rng.integers(0, num_elements, size=(n, k), dtype=np.int64)


def encode(cfg: WordProblemConfig, words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """words [B, k] → (input ids [B, k+1], labels [B, k+1]), both starting with BOS (the authors' format)."""
    ys = groups.running_products(cfg.group, words)
    bos = np.full((words.shape[0], 1), cfg.bos_id, dtype=np.int64)
    return np.concatenate([bos, words], 1), np.concatenate([bos, ys], 1)


class WordProblemData:
    def __init__(self, cfg: WordProblemConfig, seed: int, micro_batch: int, grad_accum: int):
        self.cfg, self.seed, self.micro_batch, self.grad_accum = cfg, int(seed), micro_batch, grad_accum
        self._perm_epoch, self._perm = -1, None

    # ---- training ---------------------------------------------------------------------------------------------
    def train_batch(self, step: int, micro: int) -> tuple[np.ndarray, np.ndarray]:
        c = self.cfg
        if c.num_train_samples == 0:  # fresh words every step
            words = random_words(self.seed, _TRAIN, step * self.grad_accum + micro, self.micro_batch,
                                 c.train_len, c.num_elements)
        else:  # a fixed pool, reshuffled every epoch (the paper's fixed training set)
            n = c.num_train_samples
            pos = (step * self.grad_accum + micro) * self.micro_batch + np.arange(self.micro_batch)
            rows = np.empty(self.micro_batch, dtype=np.int64)
            for epoch in np.unique(pos // n):
                sel = pos // n == epoch
                rows[sel] = self._permutation(int(epoch))[pos[sel] % n]
            words = self.pool[rows].astype(np.int64)
        return encode(c, words)

    @cached_property
    def pool(self) -> np.ndarray:
        c = self.cfg
        name = f"{c.group}_k{c.train_len}_n{c.num_train_samples}_seed{self.seed}_pool.npy"

        def make() -> np.ndarray:  # in blocks, so the pool does not depend on how it is consumed
            block = 65536
            parts = [random_words(self.seed, _POOL, b, min(block, c.num_train_samples - b * block), c.train_len,
                                  c.num_elements).astype(np.uint8)
                     for b in range((c.num_train_samples + block - 1) // block)]
            return np.concatenate(parts)

        return self._cached(name, make)

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._perm_epoch:
            self._perm = np.random.default_rng([self.seed, _PERM, epoch]).permutation(self.cfg.num_train_samples)
            self._perm_epoch = epoch
        return self._perm

    # ---- evaluation -------------------------------------------------------------------------------------------
    def eval_set(self, split: str, n: int) -> tuple[np.ndarray, np.ndarray]:
        """`val` (train_len) or `test` (test_len) words, identical for every trial."""
        c = self.cfg
        k, stream = (c.train_len, _VAL) if split == "val" else (c.test_len, _TEST)
        name = f"{c.group}_k{k}_n{n}_{split}.npy"
        words = self._cached(name, lambda: random_words(EVAL_DATA_SEED, stream, 0, n, k, c.num_elements)
                             .astype(np.uint8))
        return encode(c, words.astype(np.int64))

    def _cached(self, name: str, make) -> np.ndarray:
        if not self.cfg.cache_dir:
            return make()
        path = Path(self.cfg.cache_dir).expanduser() / name
        if path.exists():
            return np.load(path)
        arr = make()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{name}.{os.getpid()}.tmp.npy")
        np.save(tmp, arr)
        os.replace(tmp, path)
        return arr
