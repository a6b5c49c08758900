"""The one interface every token mixer implements.

    y, state = mixer(x, state=None)            # full sequence x [B, T, D]; state: None or what the last call returned
    y_t, state = mixer.step(x_t, state)         # one token x_t [B, D], O(1) state for every recurrent family

`mode` picks the full-sequence algorithm where a family has two: "chunk" (chunkwise parallel, the default for
training) or "recurrent" (token loop; the reference and what `step` runs). A state is a dict of tensors (the
recurrent matrix under "S" [B, H, K, V], conv / token-shift caches under other keys), so the LM wrapper can pass
it around without knowing the family. With `record = True` a forward stores per-token internals in `self.aux`
(keys, beta, gates, ...) for probes such as the paper's Fig. 7 and the effective-rank analysis.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ... import kernels
from ..config import ModelConfig

MODES = ("chunk", "recurrent")


class Mixer(nn.Module):
    family: str = ""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.hidden_size = cfg.hidden_size
        self.mode = "chunk"
        self.record = False
        self.aux: dict[str, torch.Tensor] = {}

    def forward(self, x: torch.Tensor, state: dict | None = None, mode: str | None = None):
        mode = mode or self.mode
        if mode not in MODES:
            raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
        return self._forward(x, state or {}, mode)

    def _forward(self, x: torch.Tensor, state: dict, mode: str):
        raise NotImplementedError

    def step(self, x_t: torch.Tensor, state: dict | None = None):
        """One token: x_t [B, D] -> (y_t [B, D], state). Runs the recurrent form on a length-1 sequence."""
        y, state = self.forward(x_t[:, None], state, mode="recurrent")
        return y[:, 0], state

    @staticmethod
    def impl_for(mode: str, impl: str = "auto") -> str:
        """The kernel implementation a forward in `mode` runs: "recurrent" is the token loop (the kernels' "naive"),
        "chunk" the configured `impl`. The kernels choose from there (dpx.kernels.resolve_impl)."""
        return "naive" if mode == "recurrent" else impl

    def recurrence(self, mode: str, q, k, v, w, initial_state=None, **kw):
        """dpx.kernels.gated_linear_recurrence (the non-delta families' state update) in `mode`, in chunks of
        cfg.chunk_size."""
        return kernels.gated_linear_recurrence(q, k, v, w, initial_state=initial_state, chunk_size=self.cfg.chunk_size,
                                               impl=self.impl_for(mode), **kw)

    def _keep(self, **tensors):
        if self.record:
            self.aux = {k: v.detach() for k, v in tensors.items() if v is not None}
