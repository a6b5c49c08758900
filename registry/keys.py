"""The contract between tasks and the registry: which metric keys a task writes, and which paper column each feeds.

Task engineers: write the SUMMARY keys (defined in dpx/rundir.py, the run-dir contract) in the dict your `run()` returns (it lands in result.json
"metrics"), and the CURVE keys through `ctx.log_curve(key, xs, ys)`. Conventions:

- accuracies are fractions in [0, 1] (the registry multiplies by 100 where the paper prints percent);
- perplexities are plain perplexities (not log); losses are nats per token;
- one trial = one (model, task variant, seed); the registry takes the best seed where the paper does (Table 2)
  and the mean over seeds elsewhere.

The registry reads the trial's resolved config to know which paper row a trial is (model variant, size, group,
language, dataset); `CONFIG_FIELDS` lists the field names it looks for, first match wins. Stdlib only.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from dpx.rundir import (  # noqa: F401  (the metric keys are defined in the run-dir contract)
    ACC_AT_TRAIN_LEN, ARC_C_ACC_NORM, ARC_E_ACC, AVG_ACC, CURVE_ACC_AT_POS, CURVE_ERANK, CURVE_LOSS_AT_POS,
    HELLASWAG_ACC_NORM, LAMBADA_ACC, LAMBADA_PPL, LOSS_BEYOND_CTX, LOSS_IN_CTX, MAX_LEN_ACC90, NUM_PARAMS, PIQA_ACC,
    SCALED_ACC, SEQ_ACC, SIX_TASKS, TOKEN_ACC, TOKENS_PER_S, VAL_LOSS, WIKITEXT_PPL, WINOGRANDE_ACC,
)

FIG8_MOVING_AVERAGE = 501  # the paper's moving-average window (tokens) for Fig. 8

# ---- where the registry finds a trial's identity in its resolved config (first match wins) --------------------
CONFIG_FIELDS: dict[str, tuple[str, ...]] = {
    "family": ("model.family", "model.mixer", "model.arch", "model.name"),
    "n_h": ("model.num_householder", "model.n_h"),
    "gated": ("model.use_forget_gate",),
    "neg_eigval": ("model.allow_neg_eigval",),  # True: beta in [0,2] (eigenvalues in [-1,1])
    "beta_range": ("model.beta_range", "model.eigval_range"),  # alternative: "[-1,1]" / "[0,1]"
    "num_layers": ("model.num_layers", "model.num_hidden_layers", "model.n_layers"),
    "num_heads": ("model.num_heads",),
    "head_dim": ("model.head_dim",),
    "size": ("model.size", "model.preset", "task.size"),  # e.g. "213M"; else num_params decides
    "matching": ("model.matching.mode", "model.matching"),  # none | heads | head_dim | mlp (models/config.py)
    "group": ("task.group",),  # S3 | S4 | A5 | S5
    "language": ("task.language", "task.name_variant", "task.variant"),  # parity | mod_arith | mod_arith_brackets
    "dataset": ("task.dataset", "eval.dataset", "task.data"),
    "train_len": ("task.train_len", "task.seq_len", "task.context_len", "train.seq_len"),
    "seq_len": ("task.seq_len", "task.context_len", "task.train_len"),  # Fig. 4's training sequence length
    # the throughput task's own batch first: every resolved trial also carries train.batch_size (its default 32),
    # which a throughput trial never uses; LM trials with task.tokens_per_step: see identity()
    "batch_size": ("task.batch_size", "train.batch_size"),
    "impl": ("task.impl",),  # throughput: dpx (our mixer) or fla (fla's GatedDeltaProduct in the same LM)
}

# Table 5's 393M Gated DeltaProduct_2 is left out: 392M and 393M are closer than any parameter count can tell.
PAPER_SIZES = {"213M": 213e6, "340M": 340e6, "392M": 392e6, "805M": 805e6}
SIZE_LABELS = set(PAPER_SIZES) | {"393M"}  # what `model.size` may name explicitly
SIZE_TOLERANCE = 0.10  # a trial with num_params within 10% of a paper size (the nearest one) is that size's row

LANGUAGE_ALIASES = {
    "parity": "parity", "parity_check": "parity",
    "mod_arith": "mod_arith", "modular_arithmetic": "mod_arith", "mod_arith_no_brackets": "mod_arith",
    "mod_arith_brackets": "mod_arith_brackets", "modular_arithmetic_brackets": "mod_arith_brackets",
}


@dataclass(frozen=True)
class Column:
    """One paper column: the summary key it comes from, the factor to the paper's unit, and the better direction."""
    paper: str  # column name in the reference CSV and in compare output
    key: str  # our summary key
    scale: float = 1.0  # ours * scale = paper's unit (100 for accuracies printed as percent)
    higher_is_better: bool = True
    language: str | None = None  # Table 2: the column holds `key` of the trials of this formal language only


# Which summary key fills which paper column, per paper table. Reference CSVs use the `paper` names.
TABLE_COLUMNS: dict[str, tuple[Column, ...]] = {
    # Table 2's "avg" is the mean of the three language columns (computed by compare when all three exist).
    "table2": (Column("parity", SCALED_ACC, language="parity"), Column("mod_arith", SCALED_ACC, language="mod_arith"),
               Column("mod_arith_brackets", SCALED_ACC, language="mod_arith_brackets")),
    "table3": (Column("wiki_ppl", WIKITEXT_PPL, 1.0, False), Column("lambada_ppl", LAMBADA_PPL, 1.0, False),
               Column("lambada_acc", LAMBADA_ACC, 100.0), Column("piqa_acc", PIQA_ACC, 100.0),
               Column("hellaswag_acc_norm", HELLASWAG_ACC_NORM, 100.0),
               Column("winogrande_acc", WINOGRANDE_ACC, 100.0), Column("arc_e_acc", ARC_E_ACC, 100.0),
               Column("arc_c_acc_norm", ARC_C_ACC_NORM, 100.0), Column("avg_acc", AVG_ACC, 100.0)),
    "table4": (Column("avg_acc", AVG_ACC, 100.0),),
    "table5": (Column("avg_acc", AVG_ACC, 100.0),),
}


def get_path(cfg: dict, path: str) -> Any:
    """cfg["a"]["b"] for "a.b"; None when any part is missing."""
    cur: Any = cfg
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def lookup(cfg: dict, concept: str) -> Any:
    for p in CONFIG_FIELDS[concept]:
        v = get_path(cfg, p)
        if v is not None:
            return v
    return None


def beta_range(cfg: dict) -> str | None:
    """'[-1,1]' (beta in [0,2]) or '[0,1]' (beta in [0,1]): the paper's eigenvalue-range suffix."""
    br = lookup(cfg, "beta_range")
    if br is not None:
        s = str(br).replace(" ", "")
        return {"[0,2]": "[-1,1]", "[-1,1]": "[-1,1]", "[0,1]": "[0,1]"}.get(s, s)
    neg = lookup(cfg, "neg_eigval")
    if neg is None:
        return None
    return "[-1,1]" if neg else "[0,1]"


def model_label(cfg: dict) -> str | None:
    """The paper's row name for a trial's model: DeltaNet, DeltaProduct_2, Gated DeltaProduct_3, or the family."""
    fam = str(lookup(cfg, "family") or "").lower()
    n_h = lookup(cfg, "n_h")
    gated = bool(lookup(cfg, "gated")) or fam.startswith("gated")
    base = fam.replace("gated_", "").replace("gated-", "").replace("gated", "").replace("-", "_")
    if base in ("deltaproduct", "delta_product", "deltanet", "delta_net", "") and (n_h is not None or base):
        n = _int(n_h) or 1
        name = "DeltaNet" if n == 1 else f"DeltaProduct_{n}"
        return f"Gated {name}" if gated else name
    return fam or None  # no model section (e.g. the debug task)


def size_label(cfg: dict, num_params: float | None) -> str | None:
    """The paper's size row ('213M', '392M', '805M') when the config names it or num_params is within 10%."""
    s = lookup(cfg, "size")
    if s is not None:
        m = re.search(r"(\d+)\s*[mM]", str(s))
        if m and f"{m.group(1)}M" in SIZE_LABELS:
            return f"{m.group(1)}M"
    if num_params:
        label, n = min(PAPER_SIZES.items(), key=lambda kv: abs(num_params - kv[1]))
        if abs(num_params - n) <= SIZE_TOLERANCE * n:
            return label
        return f"{num_params / 1e6:.3g}M"
    return str(s) if s is not None else None


def matching(cfg: dict, recipe: str) -> str | None:
    """Parameter-matching mode: from the config, else from the recipe name (table3 = head_dim, table4 = heads)."""
    m = lookup(cfg, "matching")
    if isinstance(m, dict):
        m = m.get("mode")
    if m is not None and str(m) != "none":  # "none": no matching named, so the recipe name decides
        return str(m)
    r = (recipe or "").lower()
    if r.startswith("table3"):
        return "head_dim"
    if r.startswith("table4"):
        return "heads"
    return None


def language(cfg: dict) -> str | None:
    lang = lookup(cfg, "language")
    if lang is None:
        name = str(get_path(cfg, "task.name") or "")
        lang = name if name in LANGUAGE_ALIASES else None
    return LANGUAGE_ALIASES.get(str(lang), str(lang)) if lang is not None else None


def _int(v: Any) -> int | None:
    try:
        return int(v) if v is not None and not isinstance(v, bool) else None
    except (TypeError, ValueError):
        return None


def identity(cfg: dict, recipe: str, num_params: float | None = None) -> dict[str, Any]:
    """A trial's paper-row attributes; ingest stores them as columns of the `trials` table."""
    n_h = lookup(cfg, "n_h")
    layers = lookup(cfg, "num_layers")
    tl = lookup(cfg, "train_len")
    sl, bs, nh = lookup(cfg, "seq_len"), lookup(cfg, "batch_size"), lookup(cfg, "num_heads")
    tps, ctx = _int(get_path(cfg, "task.tokens_per_step")), _int(get_path(cfg, "task.context_len"))
    if tps and ctx:  # the LM task sets the batch from its token budget (tasks/lm/task.py:resolve_train)
        bs = tps // ctx
    return {
        "model_label": model_label(cfg),
        "n_h": _int(n_h),
        "gated": bool(lookup(cfg, "gated")) or str(lookup(cfg, "family") or "").lower().startswith("gated"),
        "beta_range": beta_range(cfg),
        "num_layers": _int(layers),
        "size_label": size_label(cfg, num_params),
        "matching": matching(cfg, recipe),
        "task_name": get_path(cfg, "task.name"),
        "group_name": lookup(cfg, "group"),
        "language": language(cfg),
        "dataset": lookup(cfg, "dataset"),
        "train_len": _int(tl),
        "seq_len": _int(sl),
        "batch_size": _int(bs),
        "impl": (str(lookup(cfg, "impl")) if lookup(cfg, "impl") is not None else None),
        "num_heads": _int(nh),
    }
