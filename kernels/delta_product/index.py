"""Chunk tables: how the (flattened, possibly variable-length) token axis is cut into chunks.

A chunk holds BT tokens of one sequence (fewer at a sequence's end), i.e. BT*n interleaved Householder steps,
padded to BL = 64 rows. BT = 64 // n, the most tokens whose steps fit the 64 rows: the tiles stay full (n = 3 takes
21 tokens, 63 of 64 rows; a power of two would take 16, 48 rows, a third more chunks for the serial walk and the
per-chunk kernels). The query-side tiles are BT_TILE = next power of two >= max(16, BT) rows, masked to BT.
Every kernel (forward and backward) uses the same table, so chunk c means the same rows everywhere.
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np
import torch

BL = 64  # interleaved steps per chunk (padded); the WY inverse works on 4 blocks of 16


def tokens_per_chunk(n: int) -> int:
    if not 1 <= n <= 64:
        raise ValueError(f"num_householder: must be in [1, 64], got {n}")
    return BL // n


def query_tile(bt: int) -> int:
    """Rows of the query-side tiles for chunks of bt tokens: a power of two (Triton's tiles), at least 16 (tl.dot)."""
    t = 16
    while t < bt:
        t *= 2
    return t


@dataclasses.dataclass(frozen=True)
class ChunkTable:
    n: int              # Householder steps per token
    BT: int             # tokens per chunk (BL // n)
    N: int              # sequences
    NC: int             # chunks
    NTOK: int           # tokens (flattened)
    chunk_bos: torch.Tensor   # [NC] int64: first token of each chunk (flattened index)
    chunk_len: torch.Tensor   # [NC] int32: tokens in each chunk (1..BT)
    seq_chunks: torch.Tensor  # [N+1] int64: chunk offsets of each sequence

    @property
    def BT_TILE(self) -> int:
        """Rows of the query-side tiles (power of two >= BT, >= 16); rows past a chunk's tokens are masked."""
        return query_tile(self.BT)


def _build(bounds: np.ndarray, n: int, device: torch.device) -> ChunkTable:
    BT = tokens_per_chunk(n)
    lens = np.diff(bounds)
    if (lens < 0).any():
        raise ValueError("cu_seqlens: must be non-decreasing")
    nch = -(-lens // BT)
    seq_chunks = np.concatenate([[0], np.cumsum(nch)]).astype(np.int64)
    NC = int(seq_chunks[-1])
    first = np.repeat(bounds[:-1], nch)
    local = np.arange(NC) - np.repeat(seq_chunks[:-1], nch)
    chunk_bos = first + local * BT
    chunk_len = np.minimum(BT, np.repeat(bounds[1:], nch) - chunk_bos)
    t = lambda x, dt: torch.as_tensor(np.ascontiguousarray(x), dtype=dt).to(device, non_blocking=True)
    return ChunkTable(n, BT, len(lens), NC, int(bounds[-1]), t(chunk_bos, torch.int64), t(chunk_len, torch.int32),
                      t(seq_chunks, torch.int64))


@functools.lru_cache(maxsize=64)
def _dense_table(B: int, T: int, n: int, device: torch.device) -> ChunkTable:
    return _build(np.arange(B + 1, dtype=np.int64) * T, n, device)


def chunk_table(B: int, T: int, n: int, device, cu_seqlens=None, cu_seqlens_cpu=None) -> ChunkTable:
    """B equal sequences of T tokens, or the segments of cu_seqlens (one host sync unless cu_seqlens_cpu)."""
    if cu_seqlens is None:
        return _dense_table(B, T, n, torch.device(device))
    bounds = (cu_seqlens_cpu if cu_seqlens_cpu is not None else cu_seqlens).detach().cpu().numpy().astype(np.int64)
    return _build(bounds, n, torch.device(device))


def gather_indices(tab: ChunkTable) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(token index [NC, BT], step index [NC, BL], token validity [NC, BT]); padding points one past the end."""
    dev = tab.chunk_bos.device
    o_t = torch.arange(tab.BT, device=dev)
    o_s = torch.arange(BL, device=dev)
    valid_t = o_t[None] < tab.chunk_len[:, None]
    valid_s = o_s[None] < (tab.chunk_len[:, None] * tab.n)
    tok = torch.where(valid_t, tab.chunk_bos[:, None] + o_t[None], tab.NTOK)
    step = torch.where(valid_s, tab.chunk_bos[:, None] * tab.n + o_s[None], tab.NTOK * tab.n)
    return tok, step, valid_t
