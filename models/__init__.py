"""dpx.models: every token mixer of the seed table behind one interface, the LM wrapper, parameter matching.

`import dpx.models` stays torch-free (recipe expansion imports it): the config classes load eagerly, everything
that needs torch loads on first attribute access.
"""
from __future__ import annotations

import importlib

from .config import FAMILIES, MatchingConfig, ModelConfig

_LAZY = {
    "build_model": ".lm", "load_pretrained": ".lm", "LanguageModel": ".lm", "LMOutput": ".lm",
    "mixers": ".mixers", "MIXERS": ".mixers", "get_mixer": ".mixers",
    "matching": ".matching", "param_report": ".matching", "count_params": ".matching", "num_params": ".matching",
    "compile_model": ".compile",
}


def __getattr__(name: str):
    if name in _LAZY:
        mod = importlib.import_module(_LAZY[name], __name__)
        return mod if name in ("mixers", "matching") else getattr(mod, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["FAMILIES", "MatchingConfig", "ModelConfig", *_LAZY]
