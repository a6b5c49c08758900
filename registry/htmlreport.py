"""`report(db_path, recipe, out_html)`: one self-contained HTML file for a recipe (no external files or scripts).

Sections: trial counts; ours-beside-paper tables for every paper table/figure the recipe's trials feed; the plots
(PNG, base64-embedded); the trials with their summary metrics; failed trials with their error line; ingest
warnings (damaged run dirs); the figures the tasks saved in the run dirs.
"""
from __future__ import annotations

import base64
import html
import json
import os
import tempfile
import time
from pathlib import Path

import duckdb

from . import keys as K
from . import plots, views
from .comparison import Comparison, compare, fmt
from .db import connect

ORDER = ("table2", "table3", "table4", "table5", "fig5", "fig12", "fig4", "fig8", "fig9")
MAX_TRIAL_FIGURES = 40
MAX_FIGURE_BYTES = 3_000_000

# A paper figure is shown only when the recipe's trials log what it compares (a state-tracking report has no
# throughput panel): summary keys or curve-key prefixes per figure. Tables go by their `runs` column.
FEEDS = {"fig5": ((K.MAX_LEN_ACC90, K.ACC_AT_TRAIN_LEN), (K.CURVE_ACC_AT_POS,)),
         "fig4": ((K.TOKENS_PER_S,), ()),
         "fig8": ((K.LOSS_IN_CTX, K.LOSS_BEYOND_CTX), (K.CURVE_LOSS_AT_POS,)),
         "fig9": ((), (K.CURVE_ERANK + "/",))}
# paper settings (registry/reference/figures.json) beside the trials' config columns, for "our setting differs"
SETTING_COLUMNS = {"fig5": {"train_len": "task__train_len", "test_len": "task__test_len", "heads": "model__num_heads",
                            "head_dim": "model__head_dim", "lr": "train__lr", "beta_range": "beta_range"},
                   "fig9": {"num_layers": "model__num_layers", "num_heads": "model__num_heads"}}

CSS = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1500px}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ccc}
.wrap{max-width:100%;overflow-x:auto}
table{border-collapse:collapse;font-size:12px;margin:8px 0;max-width:100%}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:right;white-space:normal}td{overflow-wrap:break-word}th{overflow-wrap:anywhere}
th{background:#f0f0f0;min-width:3em}.differs{font-size:13px;background:#eef4ff;padding:4px 8px;border-left:3px solid #48c}
td.text{text-align:left}tr.norun td{color:#999}tr.oursonly td{background:#fff8e0}
.neg{color:#b00}.pos{color:#070}.notes{font-size:12px;color:#444}
img.plot{max-width:100%;border:1px solid #ddd;margin:6px 0}
figure{display:inline-block;margin:6px;vertical-align:top}figcaption{font-size:11px;color:#555}
.err{font-family:monospace;font-size:12px;color:#900}
"""

# Marks on <body> how many images decoded and how many tables exist once the page loaded, so a headless browser
# (tests: chromium --dump-dom) can check that the figures really render. Inline, no external resources.
LOADED = ("<script>window.addEventListener('load',function(){var i=Array.prototype.slice.call(document.images);"
          "document.body.setAttribute('data-images-ok',i.filter(function(x){return x.complete&&x.naturalWidth>0})"
          ".length);document.body.setAttribute('data-tables',document.querySelectorAll('table').length);});"
          "</script>")


class NothingToReport(ValueError):
    """The recipe has no finished trial in the database (message says what there is)."""


def _img(path: Path, cls: str, ident: str, alt: str) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return f'<img class="{cls}" id="{html.escape(ident)}" alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _table(cmp: Comparison, ident: str) -> str:
    e = html.escape
    # the long "source" cells would make every row tall: they go below the table, once each
    src = cmp.columns.index("source") if "source" in cmp.columns else None
    keep = [i for i in range(len(cmp.columns)) if i != src]
    head = "".join(f"<th>{e(cmp.columns[i])}</th>" for i in keep)
    body = []
    for raw, txt in zip(cmp.rows, cmp.text_rows()):
        status = raw[cmp.status_column] if cmp.status_column is not None else ""
        cls = {"no run yet": "norun"}.get(status, "oursonly" if str(status).startswith("ours only") else "")
        cells = []
        for col, v, t in ((cmp.columns[i], raw[i], txt[i]) for i in keep):
            c = "text" if isinstance(v, str) or v is None else ""
            if col.endswith(" delta") and isinstance(v, float):
                c += " neg" if v < 0 else " pos"
            cells.append(f'<td class="{c.strip()}">{e(t)}</td>')
        body.append(f'<tr class="{cls}">{"".join(cells)}</tr>')
    sources = sorted({r[src] for r in cmp.rows if r[src]}) if src is not None else []
    notes = "".join(f"<li>{e(n)}</li>" for n in cmp.notes)
    notes += "".join(f"<li>paper source: {e(s)}</li>" for s in sources)
    return (f'<h3>{e(cmp.title)}</h3><div class="wrap"><table class="comparison" id="{e(ident)}"><thead><tr>{head}'
            f'</tr></thead><tbody>{"".join(body)}</tbody></table></div><ul class="notes">{notes}</ul>')


def _plain_table(cols: list[str], rows: list[tuple], ident: str) -> str:
    e = html.escape
    head = "".join(f"<th>{e(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f'<td class="{"text" if isinstance(v, str) or v is None else ""}">'
                                    f"{e(fmt(v))}</td>" for v in r) + "</tr>" for r in rows)
    return f'<div class="wrap"><table id="{e(ident)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _fetch(con, sql: str, params: list) -> tuple[list[str], list[tuple]]:
    cur = con.execute(sql, params)
    return [d[0] for d in cur.description], cur.fetchall()


def _feeds(con, recipe: str) -> set[str]:
    """The paper figures this recipe's completed trials log data for."""
    _, sk = _fetch(con, "SELECT DISTINCT s.key FROM summary s JOIN trials t USING (trial_id) WHERE t.recipe = ? "
                        "AND t.status = 'completed'", [recipe])
    _, ck = _fetch(con, "SELECT DISTINCT c.key FROM curves c JOIN trials t USING (trial_id) WHERE t.recipe = ? "
                        "AND t.status = 'completed'", [recipe])
    skeys, ckeys = {r[0] for r in sk}, {r[0] for r in ck}
    return {name for name, (sums, curves) in FEEDS.items()
            if skeys & set(sums) or any(k == c or k.startswith(c) for k in ckeys for c in curves)}


def _differs(con, recipe: str, name: str) -> str:
    """`<p class="differs">` naming the settings where this recipe's trials differ from the paper's figure."""
    cols = {r[0] for r in _fetch(con, "SELECT column_name FROM information_schema.columns WHERE table_name = "
                                      "'trials'", [])[1]}
    try:
        _, rows = _fetch(con, "SELECT key, value FROM paper_settings WHERE figure = ?", [name])
    except duckdb.CatalogException:
        return ""
    out = []
    for key, value in rows:
        col = SETTING_COLUMNS.get(name, {}).get(key)
        if col is None or col not in cols:
            continue
        paper = json.loads(value) if isinstance(value, str) else value
        _, ours = _fetch(con, f"SELECT DISTINCT {views.ident(col)} FROM trials WHERE recipe = ? AND status = "
                              f"'completed' AND {views.ident(col)} IS NOT NULL ORDER BY 1", [recipe])
        ours = [r[0] for r in ours]
        if ours and any(str(o) != str(paper) and not _same_number(o, paper) for o in ours):
            shown = ", ".join(_setting(key, o) for o in ours)
            out.append(f"{key} {shown} (paper: {_setting(key, paper)})")
    if not out:
        return ""
    return (f'<p class="differs" id="differs-{html.escape(name)}">Our setting differs from the paper\'s: '
            f'{html.escape("; ".join(out))}.</p>')


def _same_number(a, b) -> bool:
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return False


def _setting(key: str, v) -> str:
    return plots.beta_label(str(v)) if key == "beta_range" else fmt(v)


def report(db_path: str | os.PathLike, recipe: str, out_html: str | os.PathLike,
           max_trial_figures: int = MAX_TRIAL_FIGURES) -> Path:
    """Write the recipe's report to out_html; at most max_trial_figures figures from the run dirs (0: none, a page
    of tables and plots only: the run dirs' probe images are ~0.2 MB each)."""
    e = html.escape
    con = connect(db_path)
    try:
        _, counts = _fetch(con, "SELECT status, count(*) FROM trials WHERE trial_id IN (SELECT trial_id FROM trial_recipes WHERE recipe = ?) GROUP BY ALL ORDER BY 1",
                           [recipe])
        counts = dict(counts)
        if not counts:
            _, known = _fetch(con, "SELECT DISTINCT recipe FROM trial_recipes ORDER BY 1", [])
            raise NothingToReport(f"recipe {recipe!r} has no trials in {db_path}; recipes there: "
                                  f"{', '.join(str(k[0]) for k in known) or 'none'}")
        if not counts.get("completed"):
            what = ", ".join(f"{n} {s}" for s, n in counts.items())
            raise NothingToReport(f"recipe {recipe!r} has no finished trials yet ({what}); nothing to report")
        try:
            view = views.ident(_fetch(con, "SELECT view_name FROM recipes WHERE recipe = ?", [recipe])[1][0][0])
        except (duckdb.CatalogException, IndexError):  # a database built before the `recipes` table existed
            view = views.ident(views.view_name_for_recipe(recipe))
        tcols, trows = _fetch(con, f"SELECT * FROM {view}", [])
        drop = {"size_label", "language", "dataset", "group_name", "host", "error", "beta_range"}
        keep = [i for i, c in enumerate(tcols) if "__" not in c and not (c in drop and all(r[i] is None for r in trows))]
        tcols, trows = [tcols[i] for i in keep], [tuple(r[i] for i in keep) for r in trows]
        fcols, frows = _fetch(con, "SELECT trial_id, attempts, error, run_dir FROM trials WHERE trial_id IN (SELECT trial_id FROM trial_recipes WHERE recipe = ?) AND "
                                   "status = 'failed' ORDER BY trial_id", [recipe])
        _, warns = _fetch(con, "SELECT w.trial_id, w.message FROM ingest_warnings w JOIN trials t USING (trial_id) "
                               "WHERE t.trial_id IN (SELECT trial_id FROM trial_recipes WHERE recipe = ?) ORDER BY 1", [recipe])
        _, figs = _fetch(con, "SELECT f.trial_id, f.name, f.path, f.bytes, t.model_label FROM figures f "
                              "JOIN trials t USING (trial_id) WHERE t.trial_id IN (SELECT trial_id FROM trial_recipes WHERE recipe = ?) AND t.status = 'completed' "
                              "ORDER BY f.trial_id, f.name", [recipe])
        _, built = _fetch(con, "SELECT value FROM meta WHERE key = 'built_at'", [])
        feeds = _feeds(con, recipe)
        differs = {name: _differs(con, recipe, name) for name in SETTING_COLUMNS}
    finally:
        con.close()

    parts = [f"<h1>dpx report: {e(recipe)}</h1>",
             '<p id="counts">' + ", ".join(f"{n} {e(str(s))}" for s, n in counts.items())
             + f" &middot; database built {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(float(built[0][0])))}"
             + "</p>"]

    parts.append("<h2>Ours beside the paper</h2>")
    shown = 0
    for name in ORDER:
        cmp = compare(db_path, name, recipe)
        runs = cmp.columns.index("runs") if "runs" in cmp.columns else None
        has = any(r[runs] for r in cmp.rows) if runs is not None else bool(cmp.rows)
        if has and (name not in FEEDS or name in feeds):
            parts.append(_table(cmp, f"cmp-{name}") + differs.get(name, ""))
            shown += 1
    if not shown:
        parts.append("<p>No trial of this recipe logged a metric that a paper table uses "
                     "(see registry/keys.py for the expected keys).</p>")

    parts.append("<h2>Plots</h2>")
    with tempfile.TemporaryDirectory() as tmp:
        pngs = [p for p in plots.write_plots(db_path, tmp, recipe, tables=())]
        for p in pngs:
            parts.append(_img(p, "plot", f"plot-{p.stem}", p.stem))
        if not pngs:
            parts.append("<p>No curves or throughput numbers to plot for this recipe.</p>")

    parts.append("<h2>Trials</h2>" + _plain_table(tcols, trows, "trials"))
    if frows:
        parts.append("<h2>Failed trials</h2>" + _plain_table(fcols, frows, "failed"))
    if warns:
        parts.append('<h2>Ingest warnings</h2><ul class="err" id="warnings">'
                     + "".join(f"<li>{e(t)}: {e(m)}</li>" for t, m in warns) + "</ul>")
    shown_figs = []
    for tid, name, path, size, label in figs[:max_trial_figures]:
        if size <= MAX_FIGURE_BYTES and Path(path).is_file():
            shown_figs.append(f"<figure>{_img(Path(path), 'trialfig', f'trialfig-{tid}-{name}', name)}"
                              f"<figcaption>{e(tid)} ({e(str(label))}): {e(name)}</figcaption></figure>")
    if shown_figs:
        more = f"<p>{len(figs) - max_trial_figures} more not shown.</p>" if len(figs) > max_trial_figures else ""
        parts.append("<h2>Figures from the run dirs</h2>" + "".join(shown_figs) + more)

    doc = (f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>dpx report: {e(recipe)}</title>'
           f"<style>{CSS}</style></head><body>{''.join(parts)}{LOADED}</body></html>")
    out = Path(out_html)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp_out.write_text(doc, encoding="utf-8")
    os.replace(tmp_out, out)
    return out
