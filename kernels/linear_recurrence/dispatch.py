"""`gated_linear_recurrence`: the entry point of the linear recurrence, the one place its implementation is chosen."""
from __future__ import annotations

import torch

from .naive import naive_gated_linear_recurrence
from .torch_chunk import torch_chunk_gated_linear_recurrence

_IMPLS = ("auto", "torch", "naive")  # no Triton kernel for this op: "auto" is the PyTorch chunkwise form


def gated_linear_recurrence(q, k, v, w, *, a=None, b=None, u=None, initial_state=None, scale: float = 1.0,
                      chunk_size: int | None = None, impl: str = "auto"):
    """The contract of `naive_gated_linear_recurrence`; impl "auto"/"torch" (chunkwise, chunks of `chunk_size` steps,
    default 64 for scalar decays and 16 for per-channel ones, whose pairwise decay tensor is K times larger) or
    "naive" (the token loop). 16-bit inputs (or autocast) run in float32, outside autocast, and o comes back in the
    inputs' dtype: the cumulative log decays and the triangular solve need float32. DPX_KERNEL_IMPL does not
    apply (it names the delta kernels' implementations)."""
    if impl not in _IMPLS:
        raise ValueError(f"impl: expected one of {_IMPLS}, got {impl!r}")
    dt = q.dtype
    if dt in (torch.float16, torch.bfloat16) or torch.is_autocast_enabled(q.device.type):
        with torch.autocast(q.device.type, enabled=False):
            f = lambda x: None if x is None else x.float()  # noqa: E731
            o, S = gated_linear_recurrence(f(q), f(k), f(v), f(w), a=f(a), b=f(b), u=f(u),
                                           initial_state=f(initial_state), scale=scale, chunk_size=chunk_size,
                                           impl=impl)
        return o.to(dt), S
    kw = dict(a=a, b=b, u=u, initial_state=initial_state, scale=scale)
    if impl == "naive":
        return naive_gated_linear_recurrence(q, k, v, w, **kw)
    C = chunk_size or (64 if w.shape[-1] == 1 else 16)
    return torch_chunk_gated_linear_recurrence(q, k, v, w, chunk_size=C, **kw)
