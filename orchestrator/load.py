"""Load a recipe: YAML (OmegaConf, interpolation) + named scale + `key=value` overrides → plain dict.

Order: file → `scales[NAME]` (selected with `scale=NAME`) → command-line overrides. An override whose key is a grid
axis pins that axis to the given value (`dpx submit fig5.yaml model.num_householder=2` runs only n_h = 2).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .errors import RecipeError, did_you_mean
from .limits import check_recipe, load_yaml, read_recipe_text

TOP_KEYS = ("name", "description", "version", "model", "task", "train", "eval", "hardware", "tracking", "grid",
            "seeds", "scales")


def parse_overrides(items: list[str], file: str) -> tuple[str | None, dict[str, Any]]:
    """`key=value` strings → (scale name or None, {dotted key: YAML-parsed value})."""
    scale, out = None, {}
    for item in items:
        if "=" not in item:
            raise RecipeError(f"override {item!r} is not key=value", file)
        key, _, raw = item.partition("=")
        key = key.strip()
        try:
            value = load_yaml(raw, file, key) if raw.strip() else ""  # bounded: no alias bomb from the shell either
        except RecipeError as e:
            if not e.reason.startswith("invalid YAML"):
                raise
            value = raw
        if key == "scale":
            scale = str(value)
        else:
            out[key] = value
    return scale, out


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> dict:
    """Read and resolve a recipe file. Raises RecipeError (one line) on anything wrong."""
    path = Path(path)
    file = str(path)
    if not path.exists():
        raise RecipeError("no such recipe file", file)
    raw = load_yaml(read_recipe_text(path, file), file)  # regular file, size, depth, alias and duplicate-key caps
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise RecipeError(f"a recipe is a mapping of sections, got {type(raw).__name__}", file)
    for k in raw:
        if k not in TOP_KEYS:
            raise RecipeError(f"unknown section{did_you_mean(k, TOP_KEYS)}; known: {', '.join(TOP_KEYS)}", file, str(k))
    raw.setdefault("name", path.stem)
    scale, cli = parse_overrides(overrides or [], file)
    scales = raw.pop("scales", None) or {}
    if not isinstance(scales, dict):
        raise RecipeError("must map scale names to {key: value} overrides", file, "scales")
    layers: list[tuple[str, dict]] = []
    if scale is not None:
        if scale not in scales:
            known = ", ".join(scales) or "none defined"
            raise RecipeError(f"unknown scale {scale!r}{did_you_mean(scale, scales)}; known: {known}", file, "scale")
        if not isinstance(scales[scale], dict):
            raise RecipeError("must be a mapping of dotted keys to values", file, f"scales.{scale}")
        layers.append((f"scales.{scale}", scales[scale]))
    layers.append(("override", cli))
    try:
        conf = OmegaConf.create(raw)
        for origin, layer in layers:
            for key, value in layer.items():
                _check_override_key(key, file, origin)
                _pin_grid_axis(conf, key)
                OmegaConf.update(conf, key, value, merge=False, force_add=True)
        out = OmegaConf.to_container(conf, resolve=True)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or None
        msg = str(e).splitlines()[0]
        raise RecipeError(f"cannot resolve: {msg}", file, key) from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as e:  # e.g. `task.steps=1` on a list
        raise RecipeError(f"cannot apply the overrides: {type(e).__name__}: {e}", file) from None
    if scale is not None:
        out["scale"] = scale
    check_recipe(out, file)  # names, seeds, NaN/inf, sizes, experiment name, grid size (limits.py)
    return out


def _check_override_key(key: str, file: str, origin: str) -> None:
    top = key.split(".", 1)[0]
    if top not in TOP_KEYS or top == "scales":
        raise RecipeError(f"unknown section {top!r}{did_you_mean(top, TOP_KEYS)} in {origin}", file, key)


def _pin_grid_axis(conf, key: str) -> None:
    """Remove `key` from every grid block (and zip group) so a fixed override wins over a grid axis."""
    grid = conf.get("grid")
    if grid is None:
        return
    blocks = grid if OmegaConf.is_list(grid) else [grid]
    for block in blocks:
        if not OmegaConf.is_dict(block):
            continue
        if key in block:
            del block[key]
        zips = block.get("zip")
        groups = zips if OmegaConf.is_list(zips) else [zips] if zips is not None else []
        for z in groups:
            if OmegaConf.is_dict(z) and key in z:
                del z[key]
        if OmegaConf.is_list(zips):  # a zip group whose every axis was pinned is gone, not an empty group
            kept = [z for z in zips if not (OmegaConf.is_dict(z) and len(z) == 0)]
            if len(kept) != len(zips):
                block["zip"] = kept if kept else None
                if not kept:
                    del block["zip"]
        elif OmegaConf.is_dict(zips) and len(zips) == 0:
            del block["zip"]
