"""dpx.kernels.fused: the delta layers' glue as fused Triton ops, each with its plain PyTorch form.

- `causal_conv1d` (short_conv.py): depthwise causal short convolution + SiLU (+ the q/k L2 norm), backward, decode cache
- `l2norm` (l2_norm.py): L2 norm over head groups (+ SiLU), for layers without a short convolution
- `rms_norm_gated` (fused_norm_gate.py): the output RMSNorm, optionally times SiLU(gate)

Every op takes impl="auto" (Triton on CUDA, the PyTorch form elsewhere and while torch.compile traces: the compiler
generates its own fused kernels for these elementwise/reduction chains, so the hand-fused ops are for eager mode;
the delta kernel itself stays one custom op under compile, the end of delta_product/chunk.py), "triton" or "torch";
`naive_*` are the references. Importing this package is cheap; triton is imported with the op modules, on first attribute access.
"""
from __future__ import annotations

import importlib

_OPS = {
    "causal_conv1d": ".short_conv", "naive_causal_conv1d": ".short_conv",
    "l2norm": ".l2_norm", "naive_l2norm": ".l2_norm",
    "rms_norm_gated": ".fused_norm_gate", "naive_rms_norm_gated": ".fused_norm_gate",
}

__all__ = list(_OPS)


def __getattr__(name: str):
    if name in _OPS:
        return getattr(importlib.import_module(_OPS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
