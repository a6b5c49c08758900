"""Matplotlib figures in the paper's layout, drawn from the results database (Agg backend, no display).

    fig5: prefix accuracy vs position, one panel per group (rows: more n_h, more layers); dashed = train length
    fig8: per-position loss vs position with the paper's 501-token moving average (clipped for short curves)
    fig9: effective rank per head along the sequence, one panel per model (deepest logged layer)
    fig4: training tokens/s bars per (seq len x batch), one bar per n_h, one panel per (task, matching mode)
    table2/table3/...: the comparison rendered as a table image (for MLflow; the HTML report uses HTML tables)

`write_plots(db_path, out_dir, recipe=None)` writes every figure that has data and returns the paths; the
orchestrator logs them to MLflow on the submission's parent run.
"""
from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from . import keys as K  # noqa: E402
from . import views  # noqa: E402
from .comparison import Comparison, compare  # noqa: E402
from .db import connect  # noqa: E402

DPI = 100


def _rows(db_path, sql: str, params: list | None = None) -> list[dict]:
    con = connect(db_path)
    try:
        cur = con.execute(sql, params or [])
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r)) for r in cur.fetchall()]
    finally:
        con.close()


def moving_average(y: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over the last `window` points (shorter at the start), NaN-aware: the paper smooths Fig. 8's
    per-position loss this way with window 501."""
    y = np.asarray(y, dtype=np.float64)
    ok = ~np.isnan(y)
    cs = np.concatenate([[0.0], np.cumsum(np.where(ok, y, 0.0))])
    cn = np.concatenate([[0], np.cumsum(ok)])
    idx = np.arange(1, len(y) + 1)
    lo = np.maximum(idx - window, 0)
    n = cn[idx] - cn[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, (cs[idx] - cs[lo]) / np.maximum(n, 1), np.nan)


def _curves(db_path, pattern: str, where: str) -> list[dict]:
    return _rows(db_path, f"""
        SELECT t.trial_id, t.model_label, t.n_h, coalesce(t.num_layers, 1) AS num_layers, t.beta_range, t.gated,
               t.group_name, t.train_len, t.dataset, c.key, list(c.x ORDER BY c.x) AS xs, list(c.y ORDER BY c.x) AS ys
        FROM trials t JOIN curves c USING (trial_id)
        WHERE t.status = 'completed' AND ({where}) AND regexp_matches(c.key, ?)
        GROUP BY ALL ORDER BY t.trial_id, c.key""", [pattern])


def _mean_curve(items: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """Mean over seeds on the union of x (NaN where a seed has no point)."""
    xs = np.unique(np.concatenate([np.asarray(i["xs"], float) for i in items]))
    stack = []
    for i in items:
        m = dict(zip(i["xs"], i["ys"]))
        stack.append([np.nan if m.get(x) is None else m[x] for x in xs])
    with np.errstate(invalid="ignore"):
        return xs, np.nanmean(np.asarray(stack, float), axis=0) if len(stack) > 1 else np.asarray(stack[0], float)


LEGEND = 9  # legend font size: legible in the report at its 1400-px width


def beta_label(beta_range: str | None) -> str:
    """The paper writes the setting as β's range: eigenvalues [-1,1] is β ∈ [0,2], [0,1] is β ∈ [0,1]."""
    return {"[-1,1]": "β∈[0,2]", "[0,1]": "β∈[0,1]"}.get((beta_range or "").replace(" ", ""), beta_range or "")


def seed_lines(ax, items: list[dict], label: str, lw: float = 1.6) -> None:
    """One setting on `ax`: with several seeds, every seed as a thin line and their mean ± one standard deviation
    as a band (a mean alone hides that one seed learned and the other did not); with one seed, its curve."""
    x, y = _mean_curve(items)
    if len(items) == 1:
        ax.plot(x, y, label=label, lw=lw)
        return
    (line,) = ax.plot(x, y, label=f"{label} (mean ± sd, {len(items)} seeds)", lw=lw)
    stack = []
    for i in items:
        m = dict(zip(i["xs"], i["ys"]))
        stack.append([np.nan if m.get(v) is None else m[v] for v in x])
        ax.plot(x, stack[-1], lw=0.6, alpha=0.45, color=line.get_color())
    with np.errstate(invalid="ignore"):
        sd = np.nanstd(np.asarray(stack, float), axis=0)
    ax.fill_between(x, y - sd, y + sd, alpha=0.18, color=line.get_color(), lw=0)


def fig5(db_path, out: Path, recipe: str | None = None) -> Path | None:
    """The paper's layout: top row one layer with n_h varying, bottom row n_h = 1 with depth varying (the
    one-layer n_h = 1 run is in both); other combinations join the top row. Mean over seeds per line."""
    data = _curves(db_path, f"^{K.CURVE_ACC_AT_POS}$", views.recipe_filter(recipe))
    data = [d for d in data if d["group_name"]]
    if not data:
        return None
    groups = sorted({d["group_name"] for d in data}, key=lambda g: ("S3", "S4", "A5", "S5").index(g)
                    if g in ("S3", "S4", "A5", "S5") else 9)
    deep = [d for d in data if (d["n_h"] or 1) == 1 and d["num_layers"] > 1]
    deep_ids = {id(d) for d in deep}
    rows = [("more n_h", [d for d in data if id(d) not in deep_ids])]
    if deep:
        rows.append(("more layers", deep + [d for d in data if (d["n_h"] or 1) == 1 and d["num_layers"] == 1]))
    fig, axes = plt.subplots(len(rows), len(groups), figsize=(max(5.5, 4.6 * len(groups)), 3.8 * len(rows)),
                             squeeze=False, sharey=True)
    for r, (row_name, row_data) in enumerate(rows):
        for ax, g in zip(axes[r], groups):
            lines = defaultdict(list)
            for d in row_data:
                if d["group_name"] == g:
                    lines[(d["num_layers"], d["n_h"] or 1, d["beta_range"] or "")].append(d)
            for (layers, n_h, br), items in sorted(lines.items()):
                seed_lines(ax, items, f"{layers}L n_h={n_h} {beta_label(br)}".strip())
            tl = next((d["train_len"] for d in data if d["group_name"] == g and d["train_len"]), None)
            if tl:
                ax.axvline(tl, ls="--", c="grey", lw=1)
            ax.set_title(f"{g}: {row_name}", fontsize=10)
            ax.set_ylim(-0.02, 1.02)
            if lines:
                ax.legend(fontsize=LEGEND)
        axes[r][0].set_ylabel("prefix accuracy")
    for ax in axes[-1]:
        ax.set_xlabel("position")
    fig.suptitle("Fig. 5: accuracy vs position (dashed: training length)", y=1.02)
    return _save(fig, out)


def fig8(db_path, out: Path, recipe: str | None = None) -> Path | None:
    data = _curves(db_path, f"^{K.CURVE_LOSS_AT_POS}(/.+)?$", views.recipe_filter(recipe))
    if not data:
        return None
    for d in data:
        d["ds"] = d["key"].split("/", 1)[1] if "/" in d["key"] else (d["dataset"] or "")
    sets = sorted({d["ds"] for d in data})
    fig, axes = plt.subplots(1, len(sets), figsize=(4.5 * len(sets), 3.4), squeeze=False)
    for ax, ds in zip(axes[0], sets):
        lines = defaultdict(list)
        for d in data:
            if d["ds"] == ds:
                lines[d["model_label"]].append(d)
        win_used = 1
        for label, items in sorted(lines.items()):
            x, y = _mean_curve(items)
            # the paper's 501-token window; a short (CPU-scale) curve gets at most a tenth of its length
            win_used = max(1, min(K.FIG8_MOVING_AVERAGE, len(y) // 10))
            n = f" (mean of {len(items)} seeds)" if len(items) > 1 else ""
            ax.plot(x, moving_average(y, win_used), label=f"{label}{n}", lw=1.4)
        tl = next((d["train_len"] for d in data if d["ds"] == ds and d["train_len"]), None)
        if tl:
            ax.axvline(tl, ls=":", c="grey", lw=1)
        ax.set_title(f"{ds or 'loss'} (moving avg {win_used})")
        ax.set_xlabel("position")
        ax.legend(fontsize=LEGEND)
    axes[0][0].set_ylabel("next-token loss")
    fig.suptitle("Fig. 8: loss vs position (dotted: training context)", y=1.04)
    return _save(fig, out)


def fig9(db_path, out: Path, recipe: str | None = None) -> Path | None:
    data = _curves(db_path, f"^{K.CURVE_ERANK}/l[0-9]+/h[0-9]+$", views.recipe_filter(recipe))
    if not data:
        return None
    for d in data:
        _, l, h = d["key"].split("/")
        d["layer"], d["head"] = int(l[1:]), int(h[1:])
    models = sorted({d["model_label"] for d in data})
    fig, axes = plt.subplots(1, len(models), figsize=(4 * len(models), 3.4), squeeze=False, sharey=True)
    for ax, m in zip(axes[0], models):
        mine = [d for d in data if d["model_label"] == m]
        layer = max(d["layer"] for d in mine)  # the paper shows a deep layer (20 of 24)
        heads = defaultdict(list)
        for d in mine:
            if d["layer"] == layer:
                heads[d["head"]].append(d)
        for h, items in sorted(heads.items()):
            seed_lines(ax, items, f"head {h}", lw=1.2)
        tl = next((d["train_len"] for d in mine if d["train_len"]), None)
        if tl:
            ax.axvline(tl, ls="--", c="grey", lw=1)
        ax.set_title(f"{m}, layer {layer}")
        ax.set_xlabel("position")
        ax.legend(fontsize=LEGEND)
    axes[0][0].set_ylabel("effective rank")
    fig.suptitle("Fig. 9: effective rank of the state per head", y=1.04)
    return _save(fig, out)


def fig4(db_path, out: Path, recipe: str | None = None) -> Path | None:
    con = connect(db_path)
    try:
        cur = con.execute(views.fig4(views.recipe_filter(recipe)))
        cols = [d[0] for d in cur.description]
        data = [dict(zip(cols, r)) for r in cur.fetchall()]
    finally:
        con.close()
    if not data:
        return None
    # one panel per (task, matching mode): throughput of different tasks is not comparable
    for d in data:
        d["panel"] = f"{d['task_name'] or '?'}, matched by: {d['matching'] or 'not named'}"
    modes = sorted({d["panel"] for d in data})
    fig, axes = plt.subplots(len(modes), 1, figsize=(7, 3 * len(modes)), squeeze=False)
    for ax, mode in zip(axes[:, 0], modes):
        mine = [d for d in data if d["panel"] == mode]
        shapes = sorted({(d["seq_len"] or 0, d["batch_size"] or 0) for d in mine})
        variants = sorted({(bool(d["gated"]), d["n_h"] or 1, d["impl"]) for d in mine})
        w = 0.8 / max(len(variants), 1)
        for i, (g, n_h, impl) in enumerate(variants):
            ys = [next((d["tokens_per_s"] for d in mine if (d["seq_len"] or 0, d["batch_size"] or 0) == s
                        and bool(d["gated"]) == g and (d["n_h"] or 1) == n_h and d["impl"] == impl), 0.0)
                  for s in shapes]
            label = f"{'gated ' if g else ''}n_h={n_h}" + (f" ({impl})" if impl != "dpx" else "")
            ax.bar(np.arange(len(shapes)) + i * w, ys, w, label=label, hatch="//" if impl != "dpx" else None)
        ax.set_xticks(np.arange(len(shapes)) + w * (len(variants) - 1) / 2)
        ax.set_xticklabels([f"{s or '?'}x{b or '?'}" for s, b in shapes])
        ax.set_title(mode)
        ax.set_ylabel("tokens/s")
        ax.legend(fontsize=LEGEND)
    axes[-1][0].set_xlabel("sequence length x batch size")
    fig.suptitle("Fig. 4: training throughput", y=1.02)
    return _save(fig, out)


def table_png(cmp: Comparison, out: Path) -> Path | None:
    if not cmp.rows:
        return None
    keep = [i for i, c in enumerate(cmp.columns) if c != "source"]
    cells = [[r[i] for i in keep] for r in cmp.text_rows()]
    fig, ax = plt.subplots(figsize=(min(2 + 1.1 * len(keep), 30), 0.6 + 0.3 * len(cells)))
    ax.axis("off")
    t = ax.table(cellText=cells, colLabels=[cmp.columns[i] for i in keep], loc="center", cellLoc="center")
    t.auto_set_font_size(False)
    t.set_fontsize(7)
    t.auto_set_column_width(list(range(len(keep))))
    ax.set_title(cmp.title, fontsize=9)
    return _save(fig, out)


def _save(fig, out: Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return out


KNOWN_CURVES = f"^({K.CURVE_ACC_AT_POS}|{K.CURVE_LOSS_AT_POS}(/.+)?|{K.CURVE_ERANK}/.*)$"
MAX_PANELS, MAX_LINES = 6, 12


def other_curves(db_path, out: Path, recipe: str | None = None) -> Path | None:
    """Curves no paper figure uses (e.g. a task's own accuracy vs length): one panel per key, one line per trial."""
    where = views.recipe_filter(recipe)
    data = _rows(db_path, f"""
        SELECT t.trial_id, t.model_label AS label, c.key,
               list(c.x ORDER BY c.x) AS xs, list(c.y ORDER BY c.x) AS ys
        FROM trials t JOIN curves c USING (trial_id)
        WHERE t.status = 'completed' AND ({where}) AND NOT regexp_matches(c.key, ?)
        GROUP BY ALL ORDER BY c.key, t.trial_id""", [KNOWN_CURVES])
    return _panels(data, out, "curves (x = position or length)", "x")


def training_curves(db_path, out: Path, recipe: str | None = None) -> Path | None:
    """Loss-like scalars against the training step (keys containing 'loss'), one line per trial."""
    where = views.recipe_filter(recipe)
    data = _rows(db_path, f"""
        SELECT t.trial_id, t.model_label AS label, m.key,
               list(m.step ORDER BY m.step) AS xs, list(m.value ORDER BY m.step) AS ys
        FROM trials t JOIN metrics m USING (trial_id)
        WHERE t.status = 'completed' AND ({where}) AND m.key LIKE '%loss%' AND m.step IS NOT NULL
        GROUP BY ALL HAVING count(*) > 1 ORDER BY m.key, t.trial_id""")
    return _panels(data, out, "training curves", "step")


def _panels(data: list[dict], out: Path, title: str, xlabel: str) -> Path | None:
    keys_ = sorted({d["key"] for d in data})[:MAX_PANELS]
    if not keys_:
        return None
    fig, axes = plt.subplots(1, len(keys_), figsize=(4 * len(keys_), 3.2), squeeze=False)
    for ax, key in zip(axes[0], keys_):
        mine = [d for d in data if d["key"] == key]
        for d in mine[:MAX_LINES]:
            y = np.array([np.nan if v is None else v for v in d["ys"]], float)
            ax.plot(d["xs"], y, lw=1.2, label=f"{d['label']} ({d['trial_id'][:6]})" if d["label"] else d["trial_id"])
        ax.set_title(key + (f" ({len(mine) - MAX_LINES} more trials not drawn)" if len(mine) > MAX_LINES else ""),
                     fontsize=9)
        ax.set_xlabel(xlabel)
        ax.legend(fontsize=LEGEND - 1)
    fig.suptitle(title, y=1.04)
    return _save(fig, out)


FIGURES = {"fig5": fig5, "fig8": fig8, "fig9": fig9, "fig4": fig4, "curves": other_curves,
           "training": training_curves}


def write_plots(db_path: str | os.PathLike, out_dir: str | os.PathLike, recipe: str | None = None,
                tables: tuple[str, ...] = ("table2", "table3", "table4", "fig5")) -> list[Path]:
    """Write fig4/5/8/9.png, curves.png (other curves), training.png (loss vs step) and <table>_table.png (only
    those with our data) into out_dir; return the paths."""
    out_dir = Path(out_dir)
    paths = []
    for name, fn in FIGURES.items():
        p = fn(db_path, out_dir / f"{name}.png", recipe)
        if p:
            paths.append(p)
    for name in tables:
        cmp = compare(db_path, name, recipe)
        if "runs" in cmp.columns:  # only rows where we have a run (the paper-only rows are in the HTML report)
            i = cmp.columns.index("runs")
            cmp.rows = [r for r in cmp.rows if r[i]]
        p = table_png(cmp, out_dir / f"{name}_table.png")
        if p:
            paths.append(p)
    return paths
