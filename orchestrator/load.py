"""Load a recipe: YAML (OmegaConf, interpolation) + `base:` composition + named scales + overrides → plain dict.

Order: `base:` recipes (in order, each deep-merged under the file) → the file → each `scale=NAME` in the order
given (stacked: `scale=cpu scale=long` applies cpu, then long) → the other command-line overrides in order.

Overrides use Hydra's override grammar (hydra-core's own parser, so `key=value` parses exactly as in Hydra:
`1e-3` is a float, `'[-1,1]'` a string, `[1,2]` a list, `null` None):
- `key=value` sets a value; on a grid axis it pins that axis (`model.num_householder=2` runs only n_h = 2);
- `key=a,b`, `key=range(1,4)`, `key=choice(a,b)` sweep: the key becomes a grid axis of every grid block (crossed
  with the rest of the grid); `seeds=0,1,2` or `seeds=range(3)` sweeps seeds. `-m/--multirun` is accepted and
  changes nothing: every dpx submission is a multirun;
- `+key=value` / `++key=value` set as well; `~key` deletes a key (its base default applies).

Composition: `base: other.yaml` (or a list, paths relative to this file; `.yaml` may be left out) starts from
those recipes: mappings merge key by key, the file wins; `grid` and `seeds` replace the base's whole; `scales`
merge per scale name; `name` is never inherited (it defaults to the file's stem).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .errors import RecipeError, did_you_mean
from .limits import check_paths, check_recipe, load_yaml, read_recipe_text

TOP_KEYS = ("name", "description", "version", "base", "model", "task", "train", "eval", "hardware", "tracking",
            "grid", "seeds", "scales")
SWEEPABLE = ("model", "task", "train", "eval")
REPLACED = ("grid", "seeds")  # composition replaces these whole instead of merging key by key


@dataclass
class Overrides:
    """Parsed command-line overrides, in the order given."""
    scales: list[str] = field(default_factory=list)
    ops: list[tuple[str, str, Any]] = field(default_factory=list)  # (kind: set | sweep | delete, key, value)


def _yaml_value(raw: str) -> Any:
    """A command-line value as YAML, bounded like a recipe file (no alias bomb from the shell either)."""
    try:
        return load_yaml(raw, "<command line>") if raw.strip() else ""
    except RecipeError as e:
        if not e.reason.startswith("invalid YAML"):
            raise
        return raw


def parse_overrides(items: list[str], file: str) -> Overrides:
    """`key=value` strings → Overrides, with Hydra's grammar (falls back to YAML values without hydra-core)."""
    out = Overrides()
    parser = None
    for item in items:
        if "=" not in item and not item.startswith("~"):
            raise RecipeError(f"override {item!r} is not key=value", file)
        try:
            if parser is None:
                from hydra.core.override_parser.overrides_parser import OverridesParser

                parser = OverridesParser.create()
            kind, key, value = _hydra_op(parser, item, file)
        except ImportError:
            kind, key, value = _plain_op(item)
        if key == "scale":
            if kind == "delete":
                raise RecipeError("`~scale` means nothing: leave the scale out", file, "scale")
            if kind == "sweep":
                raise RecipeError("scales stack, they do not sweep: write `scale=a scale=b` (applied in that "
                                  "order), or sweep the keys themselves", file, "scale")
            names = value if isinstance(value, list) else [value]
            out.scales += [str(v) for v in names]
        else:
            out.ops.append((kind, key, value))
    return out


def _plain_op(item: str) -> tuple[str, str, Any]:
    if item.startswith("~"):
        return "delete", item[1:].split("=", 1)[0].strip(), None
    key, _, raw = item.partition("=")
    return "set", key.strip().lstrip("+"), _yaml_value(raw)


def _hydra_op(parser, item: str, file: str) -> tuple[str, str, Any]:
    from hydra.errors import HydraException

    try:
        (ov,) = parser.parse_overrides([item])
    except (HydraException, ValueError, TypeError, IndexError) as e:  # ANTLR syntax errors arrive as HydraException
        msg = " ".join(str(e).split()).split(" See https://hydra.cc")[0]
        raise RecipeError(f"cannot parse override {item!r}: {msg[:200]}", file) from None
    key = ov.key_or_group
    if ov.package is not None:
        raise RecipeError(f"override {item!r}: `@package` has no meaning in a recipe", file, key)
    if ov.is_delete():
        return "delete", key, None
    if ov.is_sweep_override():
        if ov.is_interval_sweep():
            raise RecipeError("interval() is for optimizers; list the values (a,b,c) or use range()", file, key)
        try:
            values = list(ov.sweep_iterator())
        except Exception as e:  # noqa: BLE001 — e.g. a range with a zero step
            raise RecipeError(f"cannot expand the sweep: {e}", file, key) from None
        if not values:
            raise RecipeError("the sweep has no value", file, key)
        return "sweep", key, [_plain(v) for v in values]
    return "set", key, _plain(ov.value())


def _plain(v: Any) -> Any:
    """Hydra's parsed values (its own list/dict types, quoted strings) as plain Python."""
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if v is not None and not isinstance(v, (str, int, float, bool)):
        return str(v)
    return v


def _read_yaml_file(path: Path, file: str) -> Any:
    """One recipe file's YAML (every error one line naming the file): a regular file, size, depth, alias and
    duplicate-key caps (limits.py)."""
    return load_yaml(read_recipe_text(path, file), file)


def read_recipe(path: str | Path, _seen: tuple[str, ...] = ()) -> dict:
    """The recipe file as a dict, with its `base:` recipes merged under it (no scales or overrides yet)."""
    path = Path(path)
    file = str(path)
    if not path.exists():
        raise RecipeError("no such recipe file", file)
    raw = _read_yaml_file(path, file)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise RecipeError(f"a recipe is a mapping of sections, got {type(raw).__name__}", file)
    for k in raw:
        if k not in TOP_KEYS:
            raise RecipeError(f"unknown section{did_you_mean(k, TOP_KEYS)}; known: {', '.join(TOP_KEYS)}", file, str(k))
    bases = raw.pop("base", None)
    raw.setdefault("name", path.stem)
    if bases is None:
        return raw
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, list) or not all(isinstance(b, str) and b.strip() for b in bases):
        raise RecipeError("must be a recipe file or a list of them (paths relative to this file)", file, "base")
    merged: dict = {}
    for b in bases:
        bp = (path.parent / b).resolve()
        if not bp.exists() and bp.suffix not in (".yaml", ".yml"):
            bp = bp.with_name(bp.name + ".yaml")
        if not bp.exists():
            raise RecipeError(f"no such base recipe {b!r} (looked for {bp})", file, "base")
        if str(bp) in _seen or bp == path.resolve():
            raise RecipeError(f"base recipes form a cycle through {b!r}", file, "base")
        base = read_recipe(bp, _seen + (str(path.resolve()),))
        base.pop("name", None)  # a name is the file's own: never inherited
        merged = _merge(merged, base)
    return _merge(merged, raw)


def _merge(base: dict, top: dict, depth: int = 0) -> dict:
    out = dict(base)
    for k, v in top.items():
        if depth == 0 and k in REPLACED:
            out[k] = v
        elif depth == 0 and k == "scales" and isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = {**out[k], **v}  # per scale name: the file's scale replaces the base's of that name
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v, depth + 1)
        else:
            out[k] = v
    return out


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> dict:
    """Read and resolve a recipe file. Raises RecipeError (one line) on anything wrong."""
    file = str(path)
    raw = read_recipe(path)
    ov = parse_overrides(overrides or [], file)
    scales = raw.pop("scales", None) or {}
    if not isinstance(scales, dict):
        raise RecipeError("must map scale names to {key: value} overrides", file, "scales")
    layers: list[tuple[str, list[tuple[str, str, Any]]]] = []
    for scale in ov.scales:
        if scale not in scales:
            known = ", ".join(scales) or "none defined"
            raise RecipeError(f"unknown scale {scale!r}{did_you_mean(scale, scales)}; known: {known}", file, "scale")
        if not isinstance(scales[scale], dict):
            raise RecipeError("must be a mapping of dotted keys to values", file, f"scales.{scale}")
        layers.append((f"scales.{scale}", [("set", str(k), v) for k, v in scales[scale].items()]))
    layers.append(("override", ov.ops))
    try:
        conf = OmegaConf.create(raw)
        for origin, ops in layers:
            for kind, key, value in ops:
                _check_override_key(key, file, origin)
                _pin_grid_axis(conf, key)
                if kind == "set":
                    OmegaConf.update(conf, key, value, merge=False, force_add=True)
                elif kind == "delete":
                    _delete(conf, key)
                else:
                    _sweep(conf, key, value, file)
        out = OmegaConf.to_container(conf, resolve=True)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or None
        msg = str(e).splitlines()[0]
        raise RecipeError(f"cannot resolve: {msg}", file, key) from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as e:  # e.g. `task.steps=1` on a list
        raise RecipeError(f"cannot apply the overrides: {type(e).__name__}: {e}", file) from None
    if ov.scales:
        out["scale"] = "+".join(ov.scales)
    check_recipe(out, file)  # names, seeds, NaN/inf, sizes, experiment name, grid size (limits.py)
    check_paths(out, file, {key for _, key, _ in ov.ops})  # recipe paths stay in the workspace; typed ones pass
    return out


def _check_override_key(key: str, file: str, origin: str) -> None:
    top = key.split(".", 1)[0]
    if top not in TOP_KEYS or top in ("scales", "base"):
        known = [k for k in TOP_KEYS if k not in ("scales", "base")]
        raise RecipeError(f"unknown section {top!r}{did_you_mean(top, known)} in {origin}", file, key)


def _delete(conf, key: str) -> None:
    *parents, last = key.split(".")
    node = conf
    for p in parents:
        node = node.get(p) if OmegaConf.is_dict(node) else None
        if node is None:
            return
    if OmegaConf.is_dict(node) and last in node:
        del node[last]


def _sweep(conf, key: str, values: list, file: str) -> None:
    """`key=a,b`: `seeds` takes the values; a section key becomes an axis of every grid block."""
    if key == "seeds":
        conf.seeds = values
        return
    top = key.split(".", 1)[0]
    if top not in SWEEPABLE or "." not in key:
        raise RecipeError(f"only keys inside {', '.join(SWEEPABLE)} (and seeds) can be swept", file, key)
    grid = conf.get("grid")
    if grid is None or (OmegaConf.is_dict(grid) and len(grid) == 0) or (OmegaConf.is_list(grid) and len(grid) == 0):
        conf.grid = {key: values}
        return
    for block in (grid if OmegaConf.is_list(grid) else [grid]):
        if OmegaConf.is_dict(block):
            block[key] = values


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
