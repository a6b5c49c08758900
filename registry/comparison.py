"""`compare(db_path, name)`: our numbers beside the paper's, with deltas, rows with no run marked.

Returns a `Comparison` (header + rows of plain values + notes), ready for a rich table, CSV or the HTML report.
Tables 2-5 and Fig. 5 have paper numbers: each metric gets three columns, ours / paper / delta (ours - paper, in
the paper's unit). Figs. 4, 8, 9 have no numbers in the notes: the rows are ours, the notes are the paper's claims.
Fig. 7 (with Fig. 13) checks the probe's output against the paper's three claims, one row per probed trial.

Every comparison also says where our runs' setting differs from the paper's (`PAPER_SETTINGS`: training length,
steps, model size, ...): a note "setting differs: ..." per differing key with the values we ran and how many
trials ran each, and in Fig. 5 the row's status, so a delta of 0 at train length 16 is not read as the paper's 128.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from . import keys as K
from . import reference, views
from .db import connect

NO_RUN = "no run yet"
OURS_ONLY = "ours only (no paper row)"
TITLES = {
    "table2": "Table 2: formal languages, scaled accuracy (best of seeds)",
    "table3": "Table 3: language modelling, matched by head dim",
    "table4": "Table 4: language modelling, matched by number of heads (six-task average)",
    "table5": "Table 5: language modelling, 2048-token context (six-task average)",
    "fig4": "Fig. 4: training throughput (tokens/s), ratio to n_h = 1 at the same shape",
    "fig5": "Fig. 5: what fits the training range: n_h for one layer, layers for n_h = 1",
    "fig8": "Fig. 8: per-position loss inside vs beyond the training context",
    "fig9": "Fig. 9: effective rank per head inside vs beyond the training context",
    "fig12": "Fig. 12: beta in [0, 1], the negative control: what still fits the training range",
    "baselines": "Baselines (seed 001 table 8-5) on state tracking: what each architecture fits, beside theory",
    "fig7": "Figs. 7 / 13: did a head learn a rotation (two betas near 2, keys in a 3-D subspace, one head of 12)?",
}

# The paper's setting per comparison: (label, flattened trials column, paper value). A value may be a dict keyed
# by another trials column (the size row of an LM table sets its steps). Only columns present are checked.
_LM_STEPS = {"213M": 36240, "392M": 66758, "805M": 104905}
PAPER_SETTINGS: dict[str, list[tuple[str, str, Any]]] = {
    "fig5": [("train length", "task__train_len", 128), ("test length", "task__test_len", 512),
             ("hidden size", "model__hidden_size", 128), ("heads", "model__num_heads", 12),
             ("head dim", "model__head_dim", 32), ("batch", "train__batch_size", 2048),
             ("steps (100 epochs of 2M words)", "train__steps", 97700)],
    "fig7": [("group", "task__group", "S4"), ("train length", "task__train_len", 128),
             ("heads", "model__num_heads", 12), ("head dim", "model__head_dim", 32),
             ("hidden size", "model__hidden_size", 128), ("steps", "train__steps", 97700)],
    "table2": [("train max length", "task__train_max_len", 40), ("test min length", "task__test_min_len", 40),
               ("test max length", "task__test_max_len", 256), ("layers", "model__num_layers", 2),
               ("hidden size", "model__hidden_size", 128), ("heads", "model__num_heads", 4),
               ("steps", "train__steps", {"language": {"parity": 20000, "mod_arith": 100000,
                                                       "mod_arith_brackets": 100000}})],
    "table3": [("context", "task__context_len", 4096), ("tokens per step", "task__tokens_per_step", 524288),
               ("layers", "model__num_layers", 24), ("steps", "train__steps", {"size_label": _LM_STEPS})],
    "table5": [("context", "task__context_len", 2048), ("tokens per step", "task__tokens_per_step", 524288),
               ("layers", "model__num_layers", 24), ("steps", "train__steps", 66758)],
    "fig4": [("layers", "model__num_layers", 24), ("hidden size (1.3B models)", "model__hidden_size", 2048)],
    "fig8": [("context", "task__context_len", 4096), ("layers", "model__num_layers", 24),
             ("hidden size", "model__hidden_size", 1024), ("steps", "train__steps", 66758)],
    "fig9": [("context", "task__context_len", 4096), ("layers", "model__num_layers", 24),
             ("hidden size", "model__hidden_size", 1024), ("heads", "model__num_heads", 8),
             ("steps", "train__steps", 66758)],
}
PAPER_SETTINGS["table4"] = PAPER_SETTINGS["table3"]
PAPER_SETTINGS["fig12"] = PAPER_SETTINGS["fig5"]  # Fig. 5's grid and setting, beta in [0,1]
DIFFERS = "setting differs"


@dataclass
class Comparison:
    name: str
    title: str
    columns: list[str]
    rows: list[list[Any]]
    notes: list[str] = field(default_factory=list)
    status_column: int | None = None  # index of the column that says "no run yet" / "ours only"

    def text_rows(self) -> list[list[str]]:
        return [[fmt(v) for v in r] for r in self.rows]

    def keys(self) -> list[str]:
        """Column names for csv/json: unique. A name the table repeats ("paper", "delta" after each "... ours"
        column of fig5 and fig7) is qualified by the "ours" column before it: "paper: min layers (n_h=1)"."""
        seen = {c: self.columns.count(c) for c in self.columns}
        out, stem = [], ""
        for c in self.columns:
            if c.endswith(" ours"):
                stem = c[: -len(" ours")]
            out.append(f"{c}: {stem}" if seen[c] > 1 and stem else c)
        for i, c in enumerate(out):  # still repeated (no "ours" column before it): number them
            if out.count(c) > 1:
                out[i] = f"{c} ({out[:i + 1].count(c)})"
        return out

    def to_dict(self) -> dict:
        return {"name": self.name, "title": self.title, "columns": self.keys(), "rows": self.rows,
                "notes": self.notes}


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
            return f"{v:.3g}"
        return f"{v:.4g}" if abs(v) < 100 else f"{v:.2f}"
    if isinstance(v, (list, tuple)):
        return ",".join(fmt(x) for x in v)
    return str(v)


def _delta(ours: Any, paper: Any) -> float | None:
    if isinstance(ours, (int, float)) and isinstance(paper, (int, float)):
        return float(ours) - float(paper)
    return None


def _status(n_runs: int, source: Any) -> str:
    if source is None:
        return OURS_ONLY
    return NO_RUN if not n_runs else ""


def _fetch(con, sql: str) -> list[dict]:
    cur = con.execute(sql)
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def _metric_columns(name: str) -> list[tuple[str, str]]:
    """(paper column, header label) for the metric columns of a paper table."""
    if name == "table2":
        return [(c.paper, c.paper) for c in K.TABLE_COLUMNS["table2"]] + [("avg", "avg")]
    return [(c.paper, c.paper + ("" if c.higher_is_better else " (lower is better)")) for c in K.TABLE_COLUMNS[name]]


def _paper_table(con, name: str, where: str) -> Comparison:
    data = _fetch(con, views.PAPER_VIEWS[name](where))
    metric = [(col, label) for col, label in _metric_columns(name)
              if any(r[f"ours_{col}"] is not None or r[f"paper_{col}"] is not None for r in data)]
    keys = ["model", "beta_range"] if name == "table2" else ["size", "model"]
    header = keys + ["runs"]
    for _, label in metric:
        header += [f"{label} ours", f"{label} paper", f"{label} delta"]
    header += ["status", "source"]
    rows = []
    for r in data:
        row = [r[k] for k in keys] + [r["n_runs"]]
        for col, _ in metric:
            row += [r[f"ours_{col}"], r[f"paper_{col}"], _delta(r[f"ours_{col}"], r[f"paper_{col}"])]
        row += [_status(r["n_runs"], r["source"]), r["source"]]
        rows.append(row)
    units = ("accuracies in percent (ours x100), perplexities as is" if name != "table2"
             else "scaled accuracy: 0 = chance, 1 = perfect; ours = best seed")
    ran = [r for r in data if r.get("max_seeds")] if name == "table2" else []
    if ran:  # how many seeds each "best" is over (the paper's: 3)
        lo, hi = min(r["min_seeds"] for r in ran), max(r["max_seeds"] for r in ran)
        units += f" of {lo}" + (f"-{hi}" if hi != lo else "") + " seed(s) per cell (the paper's: best of 3)"
    notes = [f"delta = ours - paper; {units}"] + sorted({f"{r['model']}: {r['note']}" for r in data
                                                          if r.get("note") and "inconsistent" in r["note"]})
    return Comparison(name, TITLES[name], header, rows, notes, status_column=len(header) - 2)


def _seed_fits(per_seed) -> str | None:
    """'n_h=2: 1/2, n_h=4: 2/2' from the view's list of {n_h, n_fit, n_seeds} (None: no one-layer run)."""
    if not per_seed:
        return None
    return ", ".join(f"n_h={d['n_h']}: {d['n_fit']}/{d['n_seeds']}" for d in per_seed)


def _fig5(con, where: str) -> Comparison:
    data = _fetch(con, views.fig5(where))
    header = ["group", "runs", "min n_h (1 layer) ours", "paper", "delta", "n_h tried",
              "min layers (n_h=1) ours", "paper", "delta", "layers tried", "best len@acc>=0.9",
              "seeds that fit (1 layer)", "status", "source"]
    rows = []
    for r in data:
        ours_nh = r["ours_min_n_h_one_layer"]
        if ours_nh is None and r["n_h_tried"]:
            ours_nh = f"> {max(r['n_h_tried'])}"  # every tried n_h failed to fit the training range
        ours_l = r["ours_min_layers_n_h1"]
        if ours_l is None and r["layers_tried"]:
            ours_l = f"> {max(r['layers_tried'])}"
        paper_l = r["paper_min_layers_n_h1"]
        if paper_l is None and r["source"] is not None:
            paper_l = "> 10"
        rows.append([r["group_name"], r["n_runs"], ours_nh, r["paper_min_n_h_one_layer"],
                     _delta(r["ours_min_n_h_one_layer"], r["paper_min_n_h_one_layer"]), r["n_h_tried"],
                     ours_l, paper_l, _delta(r["ours_min_layers_n_h1"], r["paper_min_layers_n_h1"]),
                     r["layers_tried"], r["best_max_len_acc90"], _seed_fits(r.get("fits_per_seed")),
                     _status(r["n_runs"], r["source"]), r["source"]])
    notes = ["fits = prefix accuracy >= 0.9 at the training length (paper: train 128, test 512, beta [-1,1]); "
             "ours = the smallest n_h or depth that fit with any seed, and 'seeds that fit' says with how many"]
    notes += _fig5_short_fits(_fetch(con, views.fig5_fits(where)), data)
    notes += [f"{c['text']} ({c['source']})" for c in reference.load_figures()["fig5"]["claims"]]
    notes += reference.load_figures()["fig5"].get("differences", [])
    return Comparison("fig5", TITLES["fig5"], header, rows, notes, status_column=len(header) - 2)


# a fit that holds accuracy >= 0.9 to less than this times its training length is flagged: on the H200 (2026-12-03,
# train length 32) every other fitted one-layer model reached 1.4-2.1x, S3 at n_h = 1 1.25x
SHORT_FIT = 1.3


def _fig5_short_fits(runs: list[dict], groups: list[dict]) -> list[str]:
    """A note per group whose smallest fitting one-layer n_h fits its training length but does not extrapolate
    (best length at accuracy >= 0.9 under SHORT_FIT x the training length): the minimum then rests on a model that
    learned the short words, not the group's product (the H200 run of 2026-12-03: S3 at n_h = 1 held 0.9 to 40 of
    its 32 trained tokens, n_h = 2 to 67)."""
    out = []
    for g in groups:
        n_min = g["ours_min_n_h_one_layer"]
        fit = [r for r in runs if r["group_name"] == g["group_name"] and r["num_layers"] == 1 and r["fits"]
               and r["beta_range"] in (None, "[-1,1]")]
        at_min = [r for r in fit if r["n_h"] == n_min]
        if n_min is None or not at_min:
            continue
        best = max(at_min, key=lambda r: r["max_len_acc90"] or 0)
        train = best["train_len"] or 128
        if best["max_len_acc90"] is None or best["max_len_acc90"] >= SHORT_FIT * train:
            continue
        above = [r["max_len_acc90"] for r in fit if r["n_h"] > n_min and r["max_len_acc90"] is not None]
        out.append(f"{g['group_name']}: the smallest fitting n_h ({n_min}) holds accuracy >= 0.9 only to "
                   f"{fmt(best['max_len_acc90'])} tokens ({best['max_len_acc90'] / train:.2f}x its training length "
                   f"{train}): it fits the training range without extrapolating"
                   + (f"; a larger n_h reaches {fmt(max(above))}" if above else ""))
    return out


def _fig12(con, where: str) -> Comparison:
    data = _fetch(con, views.fig12(where))
    spec = reference.load_figures()["fig12"]
    header = ["group", "runs", "one-layer n_h that fit ours", "paper", "n_h tried", "n_h=1 layers that fit ours",
              "layers tried", "best len@acc>=0.9", "beta [-1,1]: one-layer n_h that fit", "best len@acc>=0.9 [-1,1]",
              "status"]
    none = lambda fit, tried: (",".join(str(x) for x in fit) if fit else "none") if tried else None
    rows = []
    for r in data:
        fit, fit_l = r["fit_n_h_01"], r["fit_layers_01"]
        agrees = not fit  # the paper: no one-layer model holds the training range with beta in [0, 1]
        pos = none(r["fit_n_h_11"], r["n_runs_11"])
        rows.append([r["group_name"], r["n_runs"], none(fit, r["n_h_tried_01"]), "none", r["n_h_tried_01"],
                     none(fit_l, r["layers_tried_01"]), r["layers_tried_01"], r["best_max_len_acc90_01"],
                     pos if r["n_runs_11"] else "no run", r["best_max_len_acc90_11"],
                     "agrees" if agrees else "differs: a one-layer beta [0,1] model fits"])
    notes = ["fits = prefix accuracy >= 0.9 at the training length; the [-1,1] columns are this workspace's Fig. 5 "
             "runs (recipes/fig5_state_tracking.yaml), the positive the control is read against"]
    notes += [f"paper: {c['text']} ({c['source']})" for c in spec["claims"]]
    if not data:
        notes.insert(0, f"{NO_RUN}: no completed state-tracking trial with beta in [0, 1] (recipes/fig12_beta01.yaml)")
    return Comparison("fig12", TITLES["fig12"], header, rows, notes, status_column=len(header) - 1)


def _figure(con, name: str, where: str) -> Comparison:
    data = _fetch(con, views.PAPER_VIEWS[name](where))
    spec = reference.load_figures()[name]
    header = list(data[0].keys()) if data else ["(no runs yet)"]
    rows = [list(r.values()) for r in data]
    notes = [f"paper: {c['text']} ({c['source']})" for c in spec["claims"]]
    notes.append(f"paper settings: {spec['settings']}")
    if not data:
        notes.insert(0, f"{NO_RUN}: no completed trial logged the keys this figure needs (see registry/keys.py)")
    return Comparison(name, TITLES[name], header, rows, notes)


def _baselines(con, where: str) -> Comparison:
    spec = reference.load_figures()["baselines"]
    archs = spec["architectures"]
    has_family = "model__family" in _columns(con, "trials")
    data = _fetch(con, views.baselines(where)) if has_family else []
    by = {}
    for r in data:
        by.setdefault(r["family"], []).append(r)
    header = ["architecture", "decay", "eigenvalues beyond [0,1]", "expected (S3, A5)", "group", "runs", "n_h",
              "train len", "best len@acc>=0.9", "acc at train len", "fits", "tokens/s", "status"]
    rows = []
    for fam in list(archs) + sorted(set(by) - set(archs)):
        a = archs.get(fam, {})
        ev = a.get("eigenvalues_beyond_0_1")
        for r in by.get(fam) or [None]:
            if r is None:
                rows.append([fam, a.get("decay"), ev, a.get("expected_S3_A5"), None, 0, None, None, None, None, None,
                             None, NO_RUN])
                continue
            tl = max(r["train_len"]) if r["train_len"] else None
            acc = r["best_acc_at_train_len"]
            fits = (acc >= 0.9) if acc is not None else (None if r["best_max_len_acc90"] is None or tl is None
                                                         else r["best_max_len_acc90"] >= tl)
            rows.append([fam, a.get("decay"), ev, a.get("expected_S3_A5"), r["group_name"], r["n_runs"], r["n_h"],
                         r["train_len"], r["best_max_len_acc90"], acc, fits, r["tokens_per_s"],
                         "ours only (not in table 8-5)" if not a else "ran"])
    notes = ["fits = prefix accuracy >= 0.9 at the training length; 'expected' is what the paper's theory and Fig. 5 "
             "say for one layer at any length (runs at a short training length can fit it without tracking state)"]
    notes += [f"paper: {c['text']} ({c['source']})" for c in spec["claims"]]
    notes.append(f"architectures: {spec['architectures_source']}")
    notes.append(f"paper settings: {spec['settings']}")
    return Comparison("baselines", TITLES["baselines"], header, rows, notes, status_column=len(header) - 1)


def _columns(con, table: str) -> set[str]:
    return {r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()}


def setting_differences(con, name: str, where: str, trial_filter: str = "TRUE") -> list[tuple[str, str, Any, dict]]:
    """(label, column, paper value, {our value: trials}) for every PAPER_SETTINGS key where some completed trial
    of this comparison ran another value."""
    cols = _columns(con, "trials")
    out = []
    for label, col, paper in PAPER_SETTINGS.get(name, []):
        if col not in cols:
            continue
        by = next(iter(paper)) if isinstance(paper, dict) else None
        if by is not None and by not in cols:
            continue
        sel = f"{views.ident(col)} AS v" + (f", {views.ident(by)} AS k" if by else ", NULL AS k")
        rows = _fetch(con, f"SELECT {sel}, count(*) AS n FROM trials t WHERE {views.DONE} AND ({where}) "
                           f"AND ({trial_filter}) AND {views.ident(col)} IS NOT NULL GROUP BY ALL")
        seen: dict = {}
        want_of = (lambda k: paper[by].get(k)) if by else (lambda k: paper)
        for r in rows:
            want = want_of(r["k"])
            if want is None or r["v"] == want:
                continue
            seen[r["v"]] = seen.get(r["v"], 0) + r["n"]
        if seen:
            shown = paper if not by else ", ".join(f"{k}: {v}" for k, v in paper[by].items())
            out.append((label, col, shown, seen))
    return out


def _setting_notes(diffs) -> list[str]:
    notes = []
    for label, _, paper, seen in diffs:
        ours = ", ".join(f"{fmt(v)} ({n} trial{'s' if n != 1 else ''})" for v, n in sorted(seen.items(), key=str))
        notes.append(f"{DIFFERS}: {label} ours {ours}, paper {paper}; deltas compare unlike settings")
    return notes


# The table-specific filters of the trials a comparison reads (as its view does).
_LM_TASK = "t.task_name IN ('lm', 'lm_eval')"
_TRIAL_FILTERS = {"fig5": "t.group_name IS NOT NULL", "fig7": "t.group_name IS NOT NULL",
                  "fig12": "t.group_name IS NOT NULL",
                  "table2": "t.language IS NOT NULL", "fig4": "t.task_name = 'throughput'",
                  "fig8": "t.task_name = 'extrapolation'", "fig9": "t.task_name = 'effective_rank'",
                  **{k: f"({v}) AND {_LM_TASK}" for k, v in views.LM_FILTERS.items()}}


def _fig5_status(con, where: str, rows: list[list], status_col: int) -> None:
    """Per group: the status says which of train length / test length / steps / width differ from the paper's."""
    cols = _columns(con, "trials")
    checks = [(lab, col, val) for lab, col, val in PAPER_SETTINGS["fig5"] if col in cols]
    if not checks:
        return
    for row in rows:
        if row[status_col]:
            continue
        g = str(row[0]).replace("'", "''")
        diffs = []
        for lab, col, val in checks:
            vals = [r["v"] for r in _fetch(con, f"SELECT DISTINCT {views.ident(col)} AS v FROM trials t WHERE "
                                                f"{views.DONE} AND ({where}) AND t.group_name = '{g}' AND "
                                                f"{views.ident(col)} IS NOT NULL")]
            other = sorted((v for v in vals if v != val), key=str)
            if other:
                diffs.append(f"{lab.split(' (')[0]} {','.join(fmt(v) for v in other)}≠{val}")
        if diffs:
            row[status_col] = f"{DIFFERS}: " + "; ".join(diffs)


def _fig7(con, where: str) -> Comparison:
    """One row per trial that ran the probe (eval.probe): the head that best shows the rotation, its mean beta per
    Householder step (from the probe's beta curves), its 3-component PCA share, and the count of such heads,
    each beside the paper's claim (Fig. 7: two betas near 2, three components > 95%; Fig. 13: 1 head of 12)."""
    spec = reference.load_figures()["fig7"]
    cols = _columns(con, "trials")
    heads_col = "model__num_heads" if "model__num_heads" in cols else "NULL"
    data = _fetch(con, f"""
        SELECT t.trial_id, t.group_name, t.n_h, coalesce(t.num_layers, 1) AS num_layers, {heads_col} AS heads,
          s.key, s.value
        FROM trials t JOIN summary s USING (trial_id)
        WHERE {views.DONE} AND ({where}) AND s.key LIKE 'probe/%'
        ORDER BY t.group_name, t.n_h, t.trial_id""")
    curves = _fetch(con, f"""
        SELECT c.trial_id, c.key, avg(c.y) FILTER (WHERE c.y <> 0) AS mean
        FROM curves c JOIN trials t USING (trial_id)
        WHERE {views.DONE} AND ({where}) AND c.key LIKE 'probe/beta/%' GROUP BY ALL""")
    beta_steps: dict[tuple[str, str], dict[int, float]] = {}
    for r in curves:  # probe/beta/l{l}/h{h}/j{j}; zeros are elements never seen (nan_to_num)
        _, _, lh, hh, jj = r["key"].split("/")
        beta_steps.setdefault((r["trial_id"], f"{lh}/{hh}"), {})[int(jj[1:])] = r["mean"]
    per: dict[str, dict] = {}
    for r in data:
        d = per.setdefault(r["trial_id"], {"row": r, "heads": {}, "rotation_heads": None})
        parts = r["key"].split("/")
        if r["key"] == "probe/rotation_heads":
            d["rotation_heads"] = int(r["value"])
        elif len(parts) == 4:
            d["heads"].setdefault(f"{parts[1]}/{parts[2]}", {})[parts[3]] = r["value"]
    header = ["trial", "group", "n_h", "layers", "heads", "rotation heads ours", "paper", "best head",
              "beta per step ours", "paper", "pca3 ours", "paper", "claims met"]
    rows = []
    for tid, d in per.items():
        r = d["row"]

        def score(item):
            h, v = item
            return (v.get("beta_mean", 0) > 1.5, v.get("pca3", 0), v.get("beta_mean", 0))
        best, bv = max(d["heads"].items(), key=score) if d["heads"] else (None, {})
        steps = beta_steps.get((tid, best), {})
        betas = [round(steps[j], 3) for j in sorted(steps)]
        met = []
        if betas and len(betas) >= 2 and all(b is not None and b > 1.5 for b in betas):
            met.append("two betas near 2")
        if bv.get("pca3") is not None and bv["pca3"] >= 0.95:
            met.append("pca3 > 0.95")
        if d["rotation_heads"] == 1:
            met.append("one head")
        rows.append([tid, r["group_name"], r["n_h"], r["num_layers"], r["heads"], d["rotation_heads"], 1, best,
                     betas or None, "both ~2", bv.get("pca3"), "> 0.95", ", ".join(met) or "none"])
    notes = [f"paper: {c['text']} ({c['source']})" for c in spec["claims"]]
    notes.append(f"paper settings: {spec['settings']}")
    notes.append("a rotation head: n_h >= 2, mean beta > 1.5 and pca3 >= 0.95 (tasks/word_problems/probe.py); "
                 "best head = the rotation head with the highest pca3, else the head closest to one")
    if not rows:
        notes.insert(0, f"{NO_RUN}: no completed trial ran the probe (eval.probe: true; recipes/fig5 has it on)")
    notes += _setting_notes(setting_differences(con, "fig7", where, _TRIAL_FILTERS["fig7"] + " AND t.trial_id IN "
                                                "(SELECT trial_id FROM summary WHERE key = 'probe/rotation_heads')"))
    return Comparison("fig7", TITLES["fig7"], header, rows, notes)


def compare(db_path: str | os.PathLike, name: str, recipe: str | None = None) -> Comparison:
    """Ours beside the paper's for `name` (table2..table5, fig4, fig5, fig7, fig8, fig9, fig12, baselines), optionally one recipe
    only. The notes end with the settings where our runs differ from the paper's (PAPER_SETTINGS)."""
    reference.check_name(name)
    where = views.recipe_filter(recipe)
    con = connect(db_path)
    try:
        if name == "fig7":
            return _fig7(con, where)
        if name == "baselines":
            c = _baselines(con, where)
            c.notes += _setting_notes(setting_differences(con, "fig5", where, _TRIAL_FILTERS["fig5"]))
            return c
        if name.startswith("table"):
            c = _paper_table(con, name, where)
        elif name == "fig5":
            c = _fig5(con, where)
            _fig5_status(con, where, c.rows, c.status_column)
        elif name == "fig12":
            c = _fig12(con, where)
        else:
            c = _figure(con, name, where)
        c.notes += _setting_notes(setting_differences(con, name, where, _TRIAL_FILTERS.get(name, "FALSE")))
        return c
    finally:
        con.close()
