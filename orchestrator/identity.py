"""Trial identity: a short stable hash of the resolved config.

Hashed: recipe version, seed and the validated `model`, `task`, `train`, `eval` sections, each reduced to the
values that differ from its config class's defaults (writing a default explicitly does not change the id, and
adding a new config field with a default keeps every existing id; changing a default that changes results must
come with a recipe `version` bump). Not hashed: `hardware`, `tracking`, the recipe's name and
description, scale names (they cannot change a result). The recipe name is NOT part of the id, but the run dir and
state are per recipe, so two recipes sharing a point each run it once.

Never change this function without bumping ID_SCHEME: tests/test_orchestrator_ids.py keeps golden ids.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

ID_SCHEME = "dpx-id-v1"
HASHED_SECTIONS = ("model", "task", "train", "eval")


def canonical_json(obj: Any) -> str:
    """Deterministic JSON: sorted keys, no whitespace, floats in repr form, tuples as lists."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=True)


def section_hash(config: dict, section_json: dict[str, str] | None = None) -> "hashlib._Hash":
    """The hash state over everything but the seed; `trial_id` finishes it. Large grids reuse it across seeds."""
    h = hashlib.sha256(ID_SCHEME.encode())
    h.update(b"|version=" + str(int(config.get("version", 1))).encode())
    for s in HASHED_SECTIONS:
        js = section_json[s] if section_json and s in section_json else canonical_json(config.get(s))
        h.update(f"|{s}=".encode() + js.encode())
    return h


def trial_id(config: dict, section_json: dict[str, str] | None = None, prefix: "hashlib._Hash | None" = None) -> str:
    """12 hex chars of sha256 over the identity-relevant part of a resolved trial config.

    `section_json` may carry precomputed canonical JSON per section, `prefix` a precomputed `section_hash`."""
    h = (prefix or section_hash(config, section_json)).copy()
    h.update(b"|seed=" + str(int(config.get("seed", 0))).encode())
    return h.hexdigest()[:12]
