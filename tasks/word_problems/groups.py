"""Finite groups for the word problem, enumerated exactly as the authors' code does (so token ids match theirs).

S_n: the permutation tuples of (0..n-1) in `itertools.permutations` (lexicographic) order; index 0 = identity.
A_n: the even permutations, kept in their S_n order and re-indexed 0..|A_n|-1 (the authors build A_n as the
commutator subgroup of S_n and re-sort by S_n index, which yields exactly this list).
Composition follows `abstract_algebra.Perm.__mul__`: (a * b)[i] = a[b[i]] (apply b first, then a).
Numpy only: the orchestrator imports nothing heavy through this module.
"""
from __future__ import annotations

import itertools
from functools import lru_cache

import numpy as np

from dpx.models.config import did_you_mean

GROUPS = ("S3", "S4", "A5", "S5")


def _parity(p: tuple[int, ...]) -> int:
    inv = sum(1 for i in range(len(p)) for j in range(i + 1, len(p)) if p[i] > p[j])
    return inv % 2


def check_group(name: str) -> None:
    if name not in GROUPS:
        hint = did_you_mean(name, GROUPS, cutoff=0.3)
        raise ValueError(f"group: unknown group {name!r}{hint}; known: {', '.join(GROUPS)}")


@lru_cache(maxsize=None)
def elements(name: str) -> tuple[tuple[int, ...], ...]:
    """The group's elements as permutation tuples, in the authors' index order (index 0 = identity)."""
    check_group(name)
    n = int(name[1:])
    perms = list(itertools.permutations(range(n)))
    if name[0] == "A":
        perms = [p for p in perms if _parity(p) == 0]
    return tuple(perms)


def compose(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """a * b with the Perm convention: (a * b)[i] = a[b[i]]."""
    return tuple(a[b[i]] for i in range(len(a)))


@lru_cache(maxsize=None)
def table(name: str) -> np.ndarray:
    """Multiplication table T[i, j] = index(elements[i] * elements[j]), int64 [|G|, |G|]."""
    els = elements(name)
    index = {p: i for i, p in enumerate(els)}
    t = np.array([[index[compose(a, b)] for b in els] for a in els], dtype=np.int64)
    t.setflags(write=False)
    return t


def order(name: str) -> int:
    return len(elements(name))


def running_products(name: str, xs: np.ndarray) -> np.ndarray:
    """Labels y_t = x_1 * ... * x_t (y_t = y_{t-1} * x_t, y_0 = identity) for a batch of words xs [B, k]."""
    t = table(name)
    ys = np.empty_like(xs)
    acc = np.zeros(xs.shape[0], dtype=xs.dtype)
    for i in range(xs.shape[1]):
        acc = t[acc, xs[:, i]]
        ys[:, i] = acc
    return ys
