"""Registry of token mixers: family name -> class (all share the interface of `base.Mixer`)."""
from __future__ import annotations

from ..config import FAMILIES, did_you_mean
from .base import MODES, Mixer
from .delta import DeltaProductMixer

MIXERS: dict[str, type[Mixer]] = {
    "deltanet": DeltaProductMixer,
    "gated_deltanet": DeltaProductMixer,
    "deltaproduct": DeltaProductMixer,
    "gated_deltaproduct": DeltaProductMixer,
}


def get_mixer(family: str) -> type[Mixer]:
    if family not in MIXERS:
        raise ValueError(f"family: no mixer registered for {family!r}" + did_you_mean(family, MIXERS)
                         + f"; known: {', '.join(f for f in FAMILIES if f in MIXERS)}")
    return MIXERS[family]


__all__ = ["MIXERS", "MODES", "Mixer", "get_mixer"]
