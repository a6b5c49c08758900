"""Parameter matching (the paper's "matching mode") and `dpx params`.

Given a model and a reference (`matching.reference`: fields that turn this model into the reference one), solve
one free dimension so the total parameter count lands within `matching.tolerance` (1%) of the reference:
- heads:    the head count (trading heads for Householders: H * (2 n_h + 2) roughly constant at fixed head_dim),
            rounded up to a multiple of `heads_multiple`; if that alone misses the tolerance, hidden_size is then
            trimmed in steps of `hidden_multiple`. This reproduces the authors' LM configs (213M: n_h=2 -> 6 heads at
            d=736, n_h=3 -> 4 heads at d=768; 805M: 12 heads at d=1468 / 8 heads at d=1536).
- head_dim: the per-head key dimension, heads fixed.
- mlp:      the SwiGLU width (intermediate_size).
Counts are exact: one block is built on torch's meta device (no memory) and multiplied by num_layers.
"""
from __future__ import annotations

import math

import torch

from .block import Block
from .config import ModelConfig


def num_params(module: torch.nn.Module) -> int:
    """The parameter count of a built module (every parameter, tied ones once): the one count dpx reports."""
    return sum(p.numel() for p in module.parameters())


def _block_params(cfg: ModelConfig) -> int:
    with torch.device("meta"):
        return num_params(Block(cfg, 0))


def count_params(cfg: ModelConfig, exclude_embeddings: bool = False) -> int:
    """Exact parameter count of build_model(cfg) without matching (cfg taken as is)."""
    d = cfg.hidden_size
    emb = cfg.vocab_size * d
    head = 0 if (cfg.tie_embeddings and cfg.num_classes is None) else cfg.output_size * d
    total = emb + cfg.num_layers * _block_params(cfg) + d + head  # + final norm
    return total - emb if exclude_embeddings else total


def reference_config(cfg: ModelConfig) -> ModelConfig:
    return cfg.replace(**cfg.matching.reference, matching={"mode": "none"})


def _rel(n: int, ref: int) -> float:
    return (n - ref) / ref


def _best(cands, ref: int):
    """(config, count) closest to ref among candidate configs (invalid ones skipped)."""
    best = None
    for c in cands:
        n = count_params(c)
        if best is None or abs(n - ref) < abs(best[1] - ref):
            best = (c, n)
    return best


def _solve1(make, ref: int, lo: int, hi: int):
    """Best (config, count) over integer x in [lo, hi], make(x) -> config or None (invalid). Counts grow with x, so
    bisect for the crossing of the reference and compare its neighbours."""
    def f(x):
        c = make(x)
        return count_params(c) if c is not None else None

    a, b = lo, hi
    while a < b:
        mid = (a + b) // 2
        v = next((f(x) for x in range(mid, min(mid + 3, b + 1)) if make(x) is not None), None)
        if v is None or v >= ref:
            b = mid
        else:
            a = mid + 1
    cands = (make(x) for x in range(max(lo, a - 3), min(hi, a + 3) + 1))
    best = _best((c for c in cands if c is not None), ref)
    if best is None:
        raise ValueError("matching.mode: no valid configuration near the reference size")
    return best


def _try(cfg: ModelConfig, **changes):
    try:
        return cfg.replace(**changes)
    except ValueError:
        return None


def solve(cfg: ModelConfig) -> tuple[ModelConfig, dict]:
    """Resolve matching: returns (config with the free dimension set and matching.mode 'none', info dict)."""
    m = cfg.matching
    plain = cfg.replace(matching={"mode": "none"})
    if m.mode == "none":
        return plain, {"mode": "none", "params": None, "reference_params": None, "matched": ""}
    ref_cfg = reference_config(cfg)
    ref = count_params(ref_cfg)
    tol = m.tolerance
    hd = cfg.key_dim  # keep the per-head size fixed when heads change
    if m.mode == "heads":
        h_max = 8 * ref_cfg.num_heads * ref_cfg.num_householder + 8
        out, n = _solve1(lambda h: _try(plain, num_heads=h, head_dim=hd), ref, 1, h_max)
        if abs(_rel(n, ref)) > tol:
            # heads alone miss: like the authors, round the exact head count up and trim hidden_size
            one, two = (count_params(plain.replace(num_heads=h, head_dim=hd)) for h in (1, 2))
            per_head, base = two - one, 2 * one - two  # params are affine in the head count
            h = max(1, math.ceil((ref - base) / per_head))
            h = m.heads_multiple * math.ceil(h / m.heads_multiple)
            step = m.hidden_multiple
            out, n = _solve1(lambda s: _try(plain, num_heads=h, head_dim=hd, hidden_size=s * step), ref,
                             1, 2 * cfg.hidden_size // step + 1)
        matched = f"num_heads={out.num_heads}"
        if out.hidden_size != cfg.hidden_size:
            matched += f", hidden_size={out.hidden_size}"
    elif m.mode == "head_dim":
        out, n = _solve1(lambda k: _try(plain, head_dim=k), ref, 1, 8 * max(ref_cfg.key_dim, cfg.key_dim))
        matched = f"head_dim={out.key_dim}"
    else:  # mlp
        out, n = _solve1(lambda i: _try(plain, intermediate_size=i), ref, 1, 16 * max(ref_cfg.mlp_size, cfg.hidden_size))
        matched = f"intermediate_size={out.intermediate_size}"
    if abs(_rel(n, ref)) > tol:
        raise ValueError(f"matching.mode: {m.mode} cannot bring {n:,} parameters within {tol:.1%} of the reference's "
                         f"{ref:,} (best: {matched}); choose another mode or reference")
    return out, {"mode": m.mode, "params": n, "reference_params": ref, "matched": matched, "rel_diff": _rel(n, ref)}


def resolve(cfg: ModelConfig) -> ModelConfig:
    return solve(cfg)[0] if cfg.matching.mode != "none" else cfg


def param_report(model_cfgs) -> list[dict]:
    """For `dpx params`: one row per model config (ModelConfig or dict):
    {family, num_householder, params, non_embedding_params, reference_params, rel_diff, mode, matched, config}."""
    rows = []
    for c in model_cfgs:
        cfg = ModelConfig.from_dict(c) if isinstance(c, dict) else c
        out, info = solve(cfg)
        rows.append({
            "family": out.family, "num_householder": out.num_householder,
            "hidden_size": out.hidden_size, "num_heads": out.num_heads, "head_dim": out.key_dim,
            "params": count_params(out), "non_embedding_params": count_params(out, exclude_embeddings=True),
            "reference_params": info["reference_params"], "rel_diff": info.get("rel_diff"),
            "mode": info["mode"], "matched": info["matched"], "config": out.to_dict(),
        })
    return rows
