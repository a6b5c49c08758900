"""Documents -> fixed-length token sequences, with a seeded shuffle buffer and a resumable position.

Each document is tokenised as <s> + tokens (no </s>), documents are concatenated, and the stream is cut into
sequences of `seq_len` tokens every `stride` tokens (training: seq_len = context_len + 1 and stride = context_len,
so input and target come from one sequence and every token is a target exactly once; extrapolation: stride =
seq_len, the authors' non-overlapping chunks). The remainder carries over to the next sequence. With
`shuffle_buffer` > 0 sequences go through a buffer from which a seeded RNG draws (flame's streaming shuffle).
A finite source is read again pass after pass (`epoch`), each pass in a new seeded document order.

`state_dict()` holds everything that decides the next sequence (pass, next document, carried tokens, buffer,
RNG), so a restored stream continues bit-identically: the training loop saves it in every checkpoint.
"""
from __future__ import annotations

import itertools
import queue
import threading
from collections import deque
from typing import Iterator

import numpy as np

from .sources import DocSource
from .tokenizer import encode_documents


class PackedStream:
    def __init__(self, source: DocSource, tok, seq_len: int, *, stride: int | None = None, seed: int = 0,
                 shuffle_buffer: int = 0, loop: bool = True, read_ahead: int = 64):
        if seq_len < 2:
            raise ValueError(f"seq_len: must be >= 2, got {seq_len}")
        self.source, self.tok, self.seq_len = source, tok, seq_len
        self.stride = stride or seq_len
        if not 0 < self.stride <= seq_len:
            raise ValueError(f"stride: must be in (0, seq_len], got {self.stride}")
        self.shuffle_buffer, self.loop = shuffle_buffer, loop
        self.dtype = np.int32 if tok.vocab_size < 2**31 else np.int64
        self.epoch, self.doc, self.emitted = 0, 0, 0
        self.carry = np.zeros(0, self.dtype)
        self.buffer: list[np.ndarray] = []
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self._it: Iterator[str] | None = None
        self._pending: deque[list[int]] = deque()
        self.read_ahead = read_ahead
        self._exhausted = False

    # ---- reading ---------------------------------------------------------------------------------------------
    def _next_doc(self) -> bool:
        """Append the next document's tokens to the carry; False when the source is exhausted (loop=False).
        Documents are read and tokenised `read_ahead` at a time (one C++ call for the batch); `doc` counts only
        those appended, so a restored stream re-reads the batch it had in hand."""
        for _ in range(2):
            if not self._pending:
                if self._it is None:
                    self._it = self.source.iter_docs(self.epoch, self.doc)
                texts = list(itertools.islice(self._it, self.read_ahead))
                if texts:
                    self._pending.extend(encode_documents(self.tok, texts))
            if self._pending:
                self.doc += 1
                ids = np.asarray(self._pending.popleft(), dtype=self.dtype)
                self.carry = np.concatenate([self.carry, ids])
                return True
            if not self.loop:
                return False
            if self.doc == 0:
                raise ValueError(f"task.dataset: {self.source.name or 'the source'} has no documents in this split")
            self.epoch, self.doc, self._it = self.epoch + 1, 0, None
        return False

    def _cut(self) -> np.ndarray | None:
        while len(self.carry) < self.seq_len:
            if not self._next_doc():
                return None
        seq = self.carry[:self.seq_len].copy()
        self.carry = self.carry[self.stride:]
        return seq

    def next_sequence(self) -> np.ndarray | None:
        if self.shuffle_buffer <= 0:
            seq = self._cut()
        else:
            while not self._exhausted and len(self.buffer) < self.shuffle_buffer:
                s = self._cut()
                if s is None:
                    self._exhausted = True
                else:
                    self.buffer.append(s)
            if not self.buffer:
                return None
            j = int(self.rng.integers(len(self.buffer)))
            self.buffer[j], self.buffer[-1] = self.buffer[-1], self.buffer[j]
            seq = self.buffer.pop()
        if seq is not None:
            self.emitted += 1
        return seq

    def next_batch(self, n: int) -> np.ndarray:
        """[n, seq_len] token ids (fewer rows only when a non-looping source ran out)."""
        rows = []
        for _ in range(n):
            s = self.next_sequence()
            if s is None:
                break
            rows.append(s)
        return np.stack(rows) if rows else np.zeros((0, self.seq_len), self.dtype)

    # ---- exact resume ----------------------------------------------------------------------------------------
    def snapshot(self) -> dict:
        """The state without copying arrays (none is modified in place: the carry is re-bound, buffer entries are
        only moved), cheap enough to take after every batch."""
        return {"epoch": self.epoch, "doc": self.doc, "emitted": self.emitted, "carry": self.carry,
                "buffer": list(self.buffer), "rng": self.rng.bit_generator.state,
                "exhausted": self._exhausted, "seq_len": self.seq_len, "stride": self.stride}

    @staticmethod
    def copy_state(state: dict) -> dict:
        return {**state, "carry": np.array(state["carry"]), "buffer": [np.array(b) for b in state["buffer"]]}

    def state_dict(self) -> dict:
        return self.copy_state(self.snapshot())

    def load_state_dict(self, state: dict) -> None:
        if (state["seq_len"], state["stride"]) != (self.seq_len, self.stride):
            raise ValueError(f"task.context_len: the checkpoint's data stream cuts {state['seq_len']}-token sequences, "
                             f"this config {self.seq_len}")
        self.epoch, self.doc, self.emitted = int(state["epoch"]), int(state["doc"]), int(state["emitted"])
        self.carry = np.asarray(state["carry"], self.dtype)
        self.buffer = [np.asarray(b, self.dtype) for b in state["buffer"]]
        self.rng.bit_generator.state = state["rng"]
        self._exhausted = bool(state["exhausted"])
        self._it, self._pending = None, deque()  # reopened at (epoch, doc) on the next read


def take_sequences(source: DocSource, tok, seq_len: int, n: int, stride: int | None = None) -> np.ndarray:
    """The first `n` sequences of a source in order (validation, evaluation): one pass, no shuffling."""
    return PackedStream(source, tok, seq_len, stride=stride, loop=False).next_batch(n)


class Prefetcher:
    """Batches of a PackedStream made `depth` ahead by a background thread, so tokenisation (SentencePiece releases
    the GIL) overlaps the training step. `state_dict()` is the stream's state right after the last batch handed
    out, not after the last one made, so checkpoints stay exact."""

    def __init__(self, stream: PackedStream, batch_size: int, depth: int = 4):
        self.stream, self.batch_size, self.depth = stream, batch_size, depth
        self._q: queue.Queue | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._state = stream.state_dict()  # state after the last batch handed out

    def _produce(self, q: queue.Queue, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                b = self.stream.next_batch(self.batch_size)
                item = (b, self.stream.snapshot())
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, which raises it
            q.put((e, None))

    def next_batch(self) -> np.ndarray:
        if self._thread is None:
            self._q, self._stop = queue.Queue(self.depth), threading.Event()
            self._thread = threading.Thread(target=self._produce, args=(self._q, self._stop), daemon=True,
                                            name="dpx-lm-prefetch")
            self._thread.start()
        b, state = self._q.get()
        if isinstance(b, BaseException):
            self.close()
            raise b
        self._state = state
        return b

    def close(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread, self._q = None, None

    def state_dict(self) -> dict:
        return PackedStream.copy_state(self._state)

    def load_state_dict(self, state: dict) -> None:
        self.close()
        self.stream.load_state_dict(state)
        self._state = self.stream.state_dict()
