"""Token-mixer families from other packages, through entry points: a user package adds a family without editing dpx.

In the user package's pyproject.toml:

    [project.entry-points."dpx.models"]
    my_mixer = "my_pkg.dpx_models:my_mixer"

where `my_pkg/dpx_models.py` (keep it torch-free: recipes are validated without torch) holds

    my_mixer = {"mixer": "my_pkg.mixer:MyMixer",   # a dpx.models.mixers.Mixer subclass: forward(x, state, mode)
                "doc": "what it is"}

The family name is the entry point's name; `model: {family: my_mixer}` then validates (`families()`, no torch),
and `build_model` imports the class on first use (`plugin_class`; `mixers.get_mixer` checks that it is a Mixer). A built-in name is never replaced; a broken
plugin is a warning naming it, not a failure of every recipe.
"""
from __future__ import annotations

import functools
import importlib
import sys
from importlib.metadata import entry_points

from .family_names import FAMILIES

GROUP = "dpx.models"


@functools.lru_cache(maxsize=1)
def specs() -> dict[str, dict]:
    """{family: spec} of the installed plugins (names and import paths only: nothing is imported)."""
    out = {}
    for ep in entry_points(group=GROUP):
        if ep.name in FAMILIES:
            print(f"dpx: warning: model plugin {ep.name!r} ({ep.value}) ignored: a built-in family has that name",
                  file=sys.stderr)
            continue
        try:
            spec = ep.load()
            if not isinstance(spec, dict) or not isinstance(spec.get("mixer"), str) or ":" not in spec["mixer"]:
                raise TypeError("expected {'mixer': 'module:Class', 'doc': ...}")
            out[ep.name] = spec
        except Exception as e:  # noqa: BLE001
            print(f"dpx: warning: model plugin {ep.name!r} ({ep.value}) not loaded: {type(e).__name__}: {e}",
                  file=sys.stderr)
    return out


def families() -> tuple[str, ...]:
    """The built-in families, then the plugins' (what `model.family` accepts)."""
    return FAMILIES + tuple(f for f in specs() if f not in FAMILIES)


def plugin_class(family: str):
    """The plugin's mixer class (its module imported here, on first use), or None when no plugin names `family`.
    Checked against dpx.models.mixers.Mixer by `mixers.get_mixer`, the torch side: this module stays torch-free."""
    spec = specs().get(family)
    if spec is None:
        return None
    module, _, name = spec["mixer"].partition(":")
    return getattr(importlib.import_module(module), name)
