"""Registry of token mixers: family name -> class (all share the interface of `base.Mixer`)."""
from __future__ import annotations

from ..config import FAMILIES, did_you_mean
from ..plugins import plugin_class, specs
from .base import MODES, Mixer
from .attention import Attention
from .delta import DeltaProductMixer
from .gla import GLA
from .linear_attention import LinearAttention
from .mamba import Mamba
from .mamba2 import Mamba2
from .retnet import RetNet
from .rwkv import RWKV4, RWKV5, RWKV6, RWKV7

MIXERS: dict[str, type[Mixer]] = {
    "linear_attention": LinearAttention,
    "retnet": RetNet,
    "rwkv4": RWKV4,
    "rwkv5": RWKV5,
    "rwkv6": RWKV6,
    "gla": GLA,
    "mamba": Mamba,
    "mamba2": Mamba2,
    "rwkv7": RWKV7,
    "transformer": Attention,
    "deltanet": DeltaProductMixer,
    "gated_deltanet": DeltaProductMixer,
    "deltaproduct": DeltaProductMixer,
    "gated_deltaproduct": DeltaProductMixer,
}


def get_mixer(family: str) -> type[Mixer]:
    if family not in MIXERS:
        cls = plugin_class(family)  # a family another package registered (models/plugins.py)
        if cls is not None:
            if not (isinstance(cls, type) and issubclass(cls, Mixer)):
                raise TypeError(f"model plugin {family!r}: {specs()[family]['mixer']} is not a "
                                "dpx.models.mixers.Mixer subclass")
            MIXERS[family] = cls
            return cls
        raise ValueError(f"family: no mixer registered for {family!r}" + did_you_mean(family, MIXERS)
                         + f"; known: {', '.join(f for f in FAMILIES if f in MIXERS)}")
    return MIXERS[family]


__all__ = ["MIXERS", "MODES", "Mixer", "get_mixer"]
