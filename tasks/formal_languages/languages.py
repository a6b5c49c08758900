"""Sample generators for parity and modular arithmetic without / with brackets, in the token ids of the reference
(Grazzi et al.'s xLSTM-repo variant, described in shared/research/tasks-data-and-metrics.md §2.2).

Each generator returns (seq [n, L] int64, answer_pos [n], answer [n]): seq holds the whole sample with the answer
token at answer_pos, then padding. Numpy only, seeded by a `np.random.Generator`.

parity (vocab 3): 0 pad, 1 = bit "0", 2 = bit "1"; S ~ U{min..max}; S-1 bits, answer 1 + (#"1" bits mod 2).
mod_arith (vocab m+5): 0 pad, 1 '+', 2 '-', 3 '*', 4 '=', 5.. digits; S odd in [2*ceil(min/2)-1, max+1 rounded
  down to odd]; `d op d ... d = r` with standard precedence (* first, then + and - left to right), r mod m.
mod_arith_brackets (vocab m+7): digits 0..m-1, '+' m, '-' m+1, '*' m+2, '(' m+3, ')' m+4, '=' m+5, [PAD] m+6;
  S = max(U{min..max}, 5); Deletang et al.'s recursive expression of S-3 tokens, then '= r [PAD]'.
"""
from __future__ import annotations

import numpy as np


def parity(rng: np.random.Generator, n: int, min_len: int, max_len: int):
    S = rng.integers(min_len, max_len + 1, size=n)
    bits = rng.integers(1, 3, size=(n, max_len - 1))
    bits[np.arange(max_len - 1)[None, :] >= (S - 1)[:, None]] = 0
    answer = 1 + (bits == 2).sum(1) % 2
    seq = np.zeros((n, max_len), dtype=np.int64)
    seq[:, :max_len - 1] = bits
    seq[np.arange(n), S - 1] = answer
    return seq, S - 1, answer


def mod_arith(rng: np.random.Generator, n: int, min_len: int, max_len: int, modulus: int = 5):
    lo, hi = (min_len + 1) // 2, (max_len + 1) // 2
    if hi < lo:
        raise ValueError(f"no odd length in [{min_len}, {max_len}]")
    S = 2 * rng.integers(lo, hi + 1, size=n) - 1
    m = (S - 1) // 2  # digits per sample
    M = int(m.max())
    digits = rng.integers(0, modulus, size=(n, M))
    ops = rng.integers(1, 4, size=(n, max(M - 1, 1)))  # 1 '+', 2 '-', 3 '*'
    # value with precedence: running total of finished signed terms, current term (a product), its sign
    total, term, sign = np.zeros(n, np.int64), digits[:, 0] % modulus, np.ones(n, np.int64)
    for i in range(1, M):
        live = i < m
        op = ops[:, i - 1]
        mul = live & (op == 3)
        new_term = live & (op != 3)
        total = np.where(new_term, (total + sign * term) % modulus, total)
        sign = np.where(new_term, np.where(op == 1, 1, -1), sign)
        term = np.where(mul, (term * digits[:, i]) % modulus, np.where(new_term, digits[:, i], term))
    value = (total + sign * term) % modulus
    L = int(S.max())
    seq = np.zeros((n, L), dtype=np.int64)
    seq[:, : 2 * M : 2] = np.where(np.arange(M)[None, :] < m[:, None], 5 + digits, 0)
    if M > 1:
        seq[:, 1 : 2 * M - 2 : 2] = np.where(np.arange(M - 1)[None, :] < (m - 1)[:, None], ops[:, : M - 1], 0)
    rows = np.arange(n)
    seq[rows, S - 2] = 4  # '='
    seq[rows, S - 1] = 5 + value
    return seq, S - 1, 5 + value


def bracket_expression(rng: np.random.Generator, length: int, modulus: int, mult: bool) -> tuple[list[int], int]:
    """Deletang et al.'s generator: an expression of exactly `length` tokens and its value mod `modulus`."""
    PLUS, MINUS, TIMES, OPEN, CLOSE = modulus, modulus + 1, modulus + 2, modulus + 3, modulus + 4
    if length < 1:
        raise ValueError(f"expression length must be >= 1, got {length}")
    if length <= 4:
        d = int(rng.integers(0, modulus))
        return {1: ([d], d), 2: ([MINUS, d], -d % modulus), 3: ([OPEN, d, CLOSE], d),
                4: ([OPEN, MINUS, d, CLOSE], -d % modulus)}[length]
    left_len = int(rng.integers(1, length - 3))  # U{1 .. length-4}
    left, lv = bracket_expression(rng, left_len, modulus, mult)
    right, rv = bracket_expression(rng, length - left_len - 3, modulus, mult)
    op = int(rng.integers(0, 3 if mult else 2))
    value = ((lv + rv) if op == 0 else (lv - rv) if op == 1 else (lv * rv)) % modulus
    return [OPEN, *left, (PLUS, MINUS, TIMES)[op], *right, CLOSE], value


def mod_arith_brackets(rng: np.random.Generator, n: int, min_len: int, max_len: int, modulus: int = 5,
                       mult: bool = False):
    EQ, PAD = modulus + 5, modulus + 6
    S = np.maximum(rng.integers(min_len, max_len + 1, size=n), 5)
    seq = np.full((n, int(S.max())), PAD, dtype=np.int64)
    answer = np.empty(n, dtype=np.int64)
    for b in range(n):
        expr, value = bracket_expression(rng, int(S[b]) - 3, modulus, mult)
        seq[b, : len(expr)] = expr
        seq[b, len(expr)] = EQ
        seq[b, len(expr) + 1] = value
        answer[b] = value
    return seq, S - 2, answer


def generate(language: str, rng: np.random.Generator, n: int, min_len: int, max_len: int, modulus: int = 5,
             mult: bool = False):
    if language == "parity":
        return parity(rng, n, min_len, max_len)
    if language == "mod_arith":
        return mod_arith(rng, n, min_len, max_len, modulus)
    if language == "mod_arith_brackets":
        return mod_arith_brackets(rng, n, min_len, max_len, modulus, mult)
    raise ValueError(f"language: unknown language {language!r}")


def frame(seq: np.ndarray, answer_pos: np.ndarray, answer: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Next-token framing of the reference: the answer position is masked with 0 in the input, the model's output
    at answer_pos - 1 must be the answer; every other target is -1 (ignored). Columns after the last answer are
    dropped (a causal model's predictions at earlier positions do not depend on them)."""
    n = len(seq)
    rows = np.arange(n)
    L = int(answer_pos.max())
    inputs = seq[:, :L].copy()
    targets = np.full((n, L), -1, dtype=np.int64)
    targets[rows, answer_pos - 1] = answer
    # (the mask of the answer token itself lies at column answer_pos, which a sample's own target never sees)
    inside = answer_pos < L
    inputs[rows[inside], answer_pos[inside]] = 0
    return inputs, targets
