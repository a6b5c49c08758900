"""Grid grammar → list of points (each point: {dotted key: value}).

- a mapping of axes is a Cartesian product:        {model.num_householder: [1, 2], train.lr: [1e-3, 3e-4]}  → 4
- `zip:` pairs axes of equal length (one or a list of zip groups), product with the other axes of the block:
      {zip: {model.num_householder: [1, 2, 3], model.num_heads: [12, 6, 4]}}                       → 3
- a list of blocks is a union:                     [{model.num_layers: [1]}, {model.num_layers: [2, 3]}] → 3
- the recipe's `seeds:` is one more axis (`seed`), crossed with every point.
A scalar where a list is expected is a one-value axis.
"""
from __future__ import annotations

import itertools
from typing import Any, Iterator

from .errors import RecipeError

SECTIONS = ("model", "task", "train", "eval")


def expand_grid(grid: Any, file: str | None = None) -> list[dict[str, Any]]:
    """Points of the grid, in declaration order (blocks in order, last axis varying fastest)."""
    if grid is None or grid == {} or grid == []:
        return [{}]
    blocks = grid if isinstance(grid, list) else [grid]
    points: list[dict[str, Any]] = []
    for i, block in enumerate(blocks):
        where = f"grid[{i}]" if isinstance(grid, list) else "grid"
        if not isinstance(block, dict):
            raise RecipeError(f"a grid block is a mapping of axes, got {type(block).__name__}", file, where)
        block_points = list(_expand_block(block, file, where))
        if not block_points:
            raise RecipeError("grid block has an empty axis, so it expands to no trial", file, where)
        points.extend(block_points)
    return points


def _expand_block(block: dict, file: str | None, where: str) -> Iterator[dict[str, Any]]:
    factors: list[list[dict[str, Any]]] = []
    for key, values in block.items():
        if key == "zip":
            groups = values if isinstance(values, list) else [values]
            for j, group in enumerate(groups):
                factors.append(_zip_group(group, file, f"{where}.zip" + (f"[{j}]" if isinstance(values, list) else "")))
            continue
        _check_axis_key(key, file, where)
        vals = values if isinstance(values, list) else [values]
        factors.append([{key: v} for v in vals])
    for combo in itertools.product(*factors):
        point: dict[str, Any] = {}
        for part in combo:
            point.update(part)
        yield point


def _zip_group(group: Any, file: str | None, where: str) -> list[dict[str, Any]]:
    if not isinstance(group, dict) or not group:
        raise RecipeError("zip takes a non-empty mapping of axes of equal length", file, where)
    lengths = {}
    for key, values in group.items():
        _check_axis_key(key, file, where)
        if not isinstance(values, list):
            raise RecipeError(f"zip axis must be a list, got {type(values).__name__}", file, f"{where}.{key}")
        lengths[key] = len(values)
    if len(set(lengths.values())) != 1:
        desc = ", ".join(f"{k}={n}" for k, n in lengths.items())
        raise RecipeError(f"zip axes differ in length ({desc})", file, where)
    keys = list(group)
    return [dict(zip(keys, vals)) for vals in zip(*(group[k] for k in keys))]


def _check_axis_key(key: str, file: str | None, where: str) -> None:
    top = str(key).split(".", 1)[0]
    if top not in SECTIONS or "." not in str(key):
        raise RecipeError(f"grid axis must be a dotted key inside {', '.join(SECTIONS)} (e.g. model.num_layers)",
                          file, f"{where}.{key}")


def set_dotted(d: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    for p in parts[:-1]:
        nxt = d.get(p)
        if not isinstance(nxt, dict):
            nxt = {}
            d[p] = nxt
        d = nxt
    d[parts[-1]] = value


def get_dotted(d: dict, key: str, default: Any = "") -> Any:
    for p in key.split("."):
        if not isinstance(d, dict) or p not in d:
            return default
        d = d[p]
    return d
