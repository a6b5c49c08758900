"""`compare(db_path, name)`: our numbers beside the paper's, with deltas, rows with no run marked.

Returns a `Comparison` (header + rows of plain values + notes), ready for a rich table, CSV or the HTML report.
Tables 2-5 and Fig. 5 have paper numbers: each metric gets three columns, ours / paper / delta (ours - paper, in
the paper's unit). Figs. 4, 8, 9 have no numbers in the notes: the rows are ours, the notes are the paper's claims.
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
}


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

    def to_dict(self) -> dict:
        return {"name": self.name, "title": self.title, "columns": self.columns, "rows": self.rows,
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
    notes = [f"delta = ours - paper; {units}"] + sorted({f"{r['model']}: {r['note']}" for r in data
                                                          if r.get("note") and "inconsistent" in r["note"]})
    return Comparison(name, TITLES[name], header, rows, notes, status_column=len(header) - 2)


def _fig5(con, where: str) -> Comparison:
    data = _fetch(con, views.fig5(where))
    header = ["group", "runs", "min n_h (1 layer) ours", "paper", "delta", "n_h tried",
              "min layers (n_h=1) ours", "paper", "delta", "layers tried", "best len@acc>=0.9", "status", "source"]
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
                     r["layers_tried"], r["best_max_len_acc90"], _status(r["n_runs"], r["source"]), r["source"]])
    notes = ["fits = prefix accuracy >= 0.9 at the training length (paper: train 128, test 512, beta [-1,1])"]
    notes += [f"{c['text']} ({c['source']})" for c in reference.load_figures()["fig5"]["claims"]]
    return Comparison("fig5", TITLES["fig5"], header, rows, notes, status_column=len(header) - 2)


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


def compare(db_path: str | os.PathLike, name: str, recipe: str | None = None) -> Comparison:
    """Ours beside the paper's for `name` (table2..table5, fig4, fig5, fig8, fig9), optionally one recipe only."""
    reference.check_name(name)
    where = views.recipe_filter(recipe)
    con = connect(db_path)
    try:
        if name.startswith("table"):
            return _paper_table(con, name, where)
        if name == "fig5":
            return _fig5(con, where)
        return _figure(con, name, where)
    finally:
        con.close()
