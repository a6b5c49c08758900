"""The built-in model families: names only (torch-free), for the config classes and the plugin loader alike."""
from __future__ import annotations

FAMILIES = (
    "linear_attention", "retnet", "rwkv4", "rwkv5", "rwkv6", "gla", "mamba", "mamba2",
    "deltanet", "gated_deltanet", "rwkv7", "deltaproduct", "gated_deltaproduct", "transformer",
)
DELTA_FAMILIES = ("deltanet", "gated_deltanet", "deltaproduct", "gated_deltaproduct")
