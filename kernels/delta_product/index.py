"""Chunk tables: how the (flattened, possibly variable-length) token axis is cut into chunks.

A chunk holds BT tokens of one sequence (fewer at a sequence's end), i.e. BT*n interleaved Householder steps,
padded to BL = 64 rows. BT = 64 // n, the most tokens whose steps fit the 64 rows: the tiles stay full (n = 3 takes
21 tokens, 63 of 64 rows; a power of two would take 16, 48 rows, a third more chunks for the serial walk and the
per-chunk kernels). The query-side tiles are next power of two >= max(16, BT) rows (32 for float32: query_tile), masked to BT.
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


def query_tile(bt: int, dtype: torch.dtype | None = None) -> int:
    """Rows of the query-side tiles for chunks of bt tokens: a power of two (Triton's tiles), at least 16 (tl.dot),
    and at least 32 for float32 data. The H200 check of 2026-12-01 (Triton 3.6, autotuning on) raised an illegal
    memory access in every float32 case at n_h = 4 and 8 (16 and 8 tokens a chunk: 16-row query tiles), in
    chunk_dp_bwd_kernel_dv_local (head dims 32, 85, 128) or chunk_dp_bwd_kernel_dh (64), the two kernels with a tf32
    dot whose N or reduction dim is the query tile; float32 at n_h = 1, 2, 3 (64- and 32-row tiles) and 16-bit data
    at 16 rows passed everywhere. 32 rows is the tile float32 n_h = 2, 3 run with; the extra rows are masked."""
    t = 32 if dtype == torch.float32 else 16
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
    # super-chunks (chunk_super.py, DPX_KERNEL_FWD=super): n consecutive chunks of one sequence (n * BT <= 64 tokens),
    # the unit that path stores one state per and computes the output over
    NSC: int = 0
    sc_chunk0: torch.Tensor | None = None  # [NSC] int64: first chunk of each super-chunk
    sc_len: torch.Tensor | None = None     # [NSC] int32: tokens in each super-chunk
    seq_sc: torch.Tensor | None = None     # [N+1] int64: super-chunk offsets of each sequence

    def bt_tile(self, dtype: torch.dtype) -> int:
        """Rows of the query-side tiles for `dtype` data (query_tile); rows past a chunk's tokens are masked."""
        return query_tile(self.BT, dtype)


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
    nsc = -(-nch // n)
    seq_sc = np.concatenate([[0], np.cumsum(nsc)]).astype(np.int64)
    sc_local = np.arange(int(seq_sc[-1])) - np.repeat(seq_sc[:-1], nsc)
    sc_chunk0 = np.repeat(seq_chunks[:-1], nsc) + sc_local * n
    sc_len = np.minimum(n * BT, np.repeat(bounds[1:], nsc) - chunk_bos[sc_chunk0])
    t = lambda x, dt: torch.as_tensor(np.ascontiguousarray(x), dtype=dt).to(device, non_blocking=True)
    return ChunkTable(n, BT, len(lens), NC, int(bounds[-1]), t(chunk_bos, torch.int64), t(chunk_len, torch.int32),
                      t(seq_chunks, torch.int64), int(seq_sc[-1]), t(sc_chunk0, torch.int64), t(sc_len, torch.int32),
                      t(seq_sc, torch.int64))


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
