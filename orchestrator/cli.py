"""The `dpx` command line. Every command reads the workspace (`.dpx/`, $DPX_WORKSPACE or --workspace).

Bad input (recipe file, key path, reason) is one line on stderr and exit status 2; nothing is written then.
"""
from __future__ import annotations

import glob
import importlib.util
import json
import os
import sys
import tempfile
import time
from enum import Enum
from pathlib import Path
from types import SimpleNamespace
from typing import List, Optional

import typer
import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import dpx
from dpx.rundir import LOG

from . import export
from . import logs as tlogs
from . import server as srv
from .api import cancel as api_cancel
from .api import expand as api_expand
from .api import start, wait_driver
from .backends.slurm import wait_accepted
from .driver.liveness import driver_alive
from .errors import RecipeError
from .grid import get_dotted
from .limits import NAME_RE, read_recipe_text, set_max_trials
from .progress import watch as watch_progress
from .refs import resolve
from .repair import check, repair_command
from .state import StateStore
from .sync import refresh_duckdb, sync_mlflow
from .tables import print_results, print_status
from .tracking import ui_url
from .workspace import Workspace

app = typer.Typer(add_completion=True, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode="markdown",
                  help="dpx: declarative experiments for linear-RNN research.\n\n"
                       "Every RECIPE argument is a recipe file or a recipe name (`recipes/quickstart.yaml` or "
                       "`quickstart`). Overrides use Hydra's grammar: `key=value`, sweeps `key=a,b` and "
                       "`key=range(1,4)`, `~key`, stacked `scale=NAME`.",
                  epilog="Examples:  `dpx submit recipes/quickstart.yaml --wait` · `dpx -w /tmp/ws status` · "
                         "`dpx show quickstart --trial 0` · `dpx --install-completion` (shell completion)")
out = Console(width=None if sys.stdout.isatty() else 200)  # pipes and CI get wide, untruncated tables
err = Console(stderr=True, width=None if sys.stderr.isatty() else 400)

WS_OPT = typer.Option(None, "--workspace", "-w", help="workspace folder (default: the global -w, $DPX_WORKSPACE "
                      "or .dpx)")
MULTIRUN_OPT = typer.Option(False, "--multirun", "-m", help="accepted for Hydra habits; every dpx submission is a "
                            "multirun (sweeps need no flag)")
_GLOBAL = {"workspace": None}


class Fmt(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"
    parquet = "parquet"


class ExpandFmt(str, Enum):
    table = "table"
    json = "json"
    ids = "ids"


def _version(value: bool) -> None:
    if value:
        print(f"dpx {dpx.__version__}")
        raise typer.Exit()


@app.callback()
def _global(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                         help="print the version and exit"),
            workspace: Optional[str] = typer.Option(None, "--workspace", "-w",
                                                    help="workspace folder for every command (default .dpx or "
                                                         "$DPX_WORKSPACE)")):
    """dpx: declarative experiments for linear-RNN research."""
    _GLOBAL["workspace"] = workspace


def _fail(msg: str, code: int = 2) -> None:
    err.print(f"[red]error:[/red] {escape(msg)}", highlight=False, soft_wrap=True)  # user text is not markup
    raise typer.Exit(code)


def _ws(path: Optional[str], must_exist: bool = False):
    ws = Workspace.resolve(path or _GLOBAL["workspace"])
    if ws.root.exists() and not ws.root.is_dir():
        _fail(f"{ws.root}: not a folder (--workspace and $DPX_WORKSPACE name a workspace folder)")
    problem = check(ws)  # a damaged state store: one line; a deleted one is rebuilt from the run dirs
    if problem:
        _fail(problem)
    if must_exist and not ws.exists:
        _fail(f"{ws.root}: no dpx workspace here yet (run `dpx submit RECIPE` first, or pass --workspace)")
    return ws


def _need(module: str, extra: str) -> None:
    """A command that needs an optional stack: one line naming the extra when it is missing."""
    if importlib.util.find_spec(module) is None:
        _fail(f"this needs {module}, which is not installed: pip install 'dpx[{extra}]'", 1)


def _store(ws):
    return StateStore(ws.state_db) if ws.exists else None


def _expand(recipe: str, overrides: list[str], workspace: Optional[str] = None):
    try:
        return api_expand(recipe, overrides, _ws(workspace))
    except RecipeError as e:
        _fail(e.line())


def _recipe_name(arg: str, ws=None) -> str:
    """A recipe argument may be a file (its `name:` wins) or a bare name."""
    p = Path(arg)
    if p.exists() and not p.is_file():  # a folder, a FIFO, a device: one line saying which, never a hang
        try:
            read_recipe_text(p, arg)
        except RecipeError as e:
            _fail(e.line())
    return resolve(arg, _store(ws) if ws is not None else None).name


def _complete_recipe(incomplete: str) -> list[str]:
    """Shell completion for RECIPE: names of recipes/*.yaml here, files under a typed folder, and the recipe names
    the workspace knows."""
    if "/" in incomplete or incomplete.startswith("."):
        return sorted(glob.glob(incomplete + "*.y*ml")) + [d + "/" for d in sorted(glob.glob(incomplete + "*"))
                                                          if os.path.isdir(d)]
    found = [Path(f).stem for f in sorted(glob.glob(f"recipes/{glob.escape(incomplete)}*.yaml"))]  # by name
    found += [d + "/" for d in sorted(glob.glob(glob.escape(incomplete) + "*")) if os.path.isdir(d)]
    try:
        ws = _ws(None)
        store = _store(ws)
        if store is not None:
            found += sorted({n for n in store.recipes() if n.startswith(incomplete)} - set(found))
    except Exception:  # noqa: BLE001 — completion must never fail loudly
        pass
    return found


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


# ---- expand / show -----------------------------------------------------------------------------------------
OVERRIDES_ARG = typer.Argument(None, help="overrides (Hydra grammar): key=value, key=a,b, key=range(1,4), ~key, "
                               "scale=NAME (repeatable: stacked in order)")


@app.command(epilog="Examples:  `dpx expand recipes/fig5_state_tracking.yaml scale=cpu` · "
                    "`dpx expand quickstart model.num_householder=1,2 seeds=range(3)` · `dpx expand fig5_state_tracking --format ids`")
def expand(recipe: str = typer.Argument(..., help="recipe file or name", autocompletion=_complete_recipe),
           overrides: Optional[List[str]] = OVERRIDES_ARG,
           fmt: ExpandFmt = typer.Option(ExpandFmt.table, "--format", help="table | json | ids"),
           limit: int = typer.Option(50, help="rows shown in the table (0: all)"),
           max_trials: Optional[int] = typer.Option(None, "--max-trials", help="allow grids above 100,000 trials"),
           multirun: bool = MULTIRUN_OPT):
    """Print the trial grid (count, trial ids, the axes that vary). Runs nothing, writes nothing."""
    set_max_trials(max_trials)
    t0 = time.perf_counter()
    ex = _expand(recipe, overrides or [])
    dt = time.perf_counter() - t0
    if fmt == ExpandFmt.ids:
        for t in ex.trials:
            print(t.trial_id)
        return
    if fmt == ExpandFmt.json:
        print(json.dumps([{"trial_id": t.trial_id, **t.point} for t in ex.trials], default=str))
        return
    table = Table(title=f"{ex.recipe}: {len(ex.trials)} trials", show_lines=False)
    table.add_column("#", justify="right")
    table.add_column("trial_id")
    axes = ex.axes
    for a in axes:
        table.add_column(a)
    shown = ex.trials if not limit else ex.trials[:limit]
    for i, t in enumerate(shown):
        table.add_row(str(i), t.trial_id, *[_fmt(t.config['seed'] if a == 'seed' else get_dotted(t.config, a)) for a in axes])
    out.print(table)
    if limit and len(ex.trials) > limit:
        out.print(f"... {len(ex.trials) - limit} more (--limit 0 shows all)")
    out.print(f"{len(ex.trials)} trials; varying: {', '.join(axes) or 'nothing'}; backend "
              f"{ex.meta.hardware.backend}; expanded in {dt:.2f}s")


@app.command(epilog="Examples:  `dpx show recipes/fig12_beta01.yaml` (the recipe after base:, scales, overrides) · "
                    "`dpx show quickstart --trial 2` · `dpx show quickstart --trial 5ccafb` (an id prefix)")
def show(recipe: str = typer.Argument(..., help="recipe file or name", autocompletion=_complete_recipe),
         overrides: Optional[List[str]] = OVERRIDES_ARG,
         trial: Optional[str] = typer.Option(None, "--trial", "-t", help="a trial's resolved config: its number "
                                             "in `dpx expand` or a trial id prefix"),
         multirun: bool = MULTIRUN_OPT):
    """Print the resolved recipe (after base:, scales and overrides), or one trial's resolved config, as YAML
    (Hydra's `--cfg job`). Runs nothing, writes nothing."""
    ex = _expand(recipe, overrides or [])
    if trial is None:
        sys.stdout.write(yaml.safe_dump(ex.raw, sort_keys=False))
        return
    if trial.isdigit() and len(trial) < 6:
        i = int(trial)
        if i >= len(ex.trials):
            _fail(f"{recipe}: no trial {i} (the grid has {len(ex.trials)}: 0-{len(ex.trials) - 1})")
        t = ex.trials[i]
    else:
        hits = [t for t in ex.trials if t.trial_id.startswith(trial)]
        if len(hits) != 1:
            _fail(f"{recipe}: {'no trial id starts with' if not hits else 'ambiguous trial id prefix'} {trial!r}")
        t = hits[0]
    sys.stdout.write(yaml.safe_dump(t.config, sort_keys=False))


# ---- submit / rerun / watch -----------------------------------------------------------------------------------
def _submit(recipe: str, overrides: list[str], wait: bool, workspace: Optional[str], rerun_failed: bool) -> None:
    ws = _ws(workspace)
    try:
        st = start(recipe, overrides, ws, rerun_failed=rerun_failed)
    except RecipeError as e:
        _fail(e.line())
    ex, sub_id, c = st.expansion, st.sub_id, st.counts
    if st.reused_overrides is not None:
        out.print(f"reusing the overrides of submission {st.reused_overrides[0]}: "
                  f"{escape(' '.join(st.reused_overrides[1]))}", highlight=False)
    if st.reset is not None:
        out.print(f"{st.reset} failed/cancelled trial(s) of {ex.recipe} queued again")
    out.print(f"submission {sub_id}: {len(ex.trials)} trials ({st.new} new); "
              f"{c['completed']} already completed, {c['failed']} failed, {st.todo} to run "
              f"on {ex.meta.hardware.backend}")
    store = StateStore(st.ws.state_db)
    if st.todo == 0:
        out.print("nothing to run" + (" (use `dpx rerun RECIPE --failed` for failed trials)" if c["failed"] else ""))
    else:
        if st.handed_to is not None:
            out.print(f"a driver of {ex.recipe} is running (submission {st.handed_to['id']}, pid "
                      f"{st.handed_to['driver_pid']}): {st.handed} new trial(s) joined its queue; this "
                      f"submission's driver waits for it (one driver per recipe)")
        out.print(f"driver pid {st.driver_pid}; log {escape(str(st.ws.drivers / (sub_id + '.log')))}")  # not markup
        if ex.meta.hardware.backend == "slurm" and not wait:  # return once sbatch has accepted the arrays
            jobs = wait_accepted(store, sub_id)
            out.print(f"sbatch accepted: Slurm job {', '.join(jobs)}" if jobs else "no Slurm job yet: see `dpx status`")
    if wait:
        _watch_and_report(st.ws, store, sub_id, ex.recipe, ex.axes)


def _watch_and_report(ws, store, sub_id: str, recipe: str, axes: list[str]) -> None:
    watch_progress(ws, store, sub_id, SimpleNamespace(recipe=recipe))
    _wait_driver(ws, store, sub_id)
    print_results(ws, store, recipe, sub_id, axes, out)
    failed = store.counts(submission=sub_id)["failed"]
    raise typer.Exit(1 if failed else 0)


def _wait_driver(ws, store, sub_id: str, limit_s: float = 900) -> None:
    """After the trials: wait while the driver finishes MLflow logging, the DuckDB tables and the recipe figures,
    so that `dpx ui` / `dpx query` right after `--wait` see everything."""
    with err.status("finishing: MLflow logging, results tables, figures ..."):
        wait_driver(ws, store, sub_id, limit_s)


WAIT_OPT = typer.Option(False, "--wait/--no-wait", help="show live progress until the grid finishes, then the "
                        "results (exit 1 if a trial failed)")


@app.command(epilog="Examples:  `dpx submit recipes/quickstart.yaml --wait` · "
                    "`dpx submit fig5_state_tracking scale=cpu model.num_householder=1,2` · "
                    "`dpx -w /scratch/ws submit table2_formal_languages seeds=range(3)`")
def submit(recipe: str = typer.Argument(..., help="recipe file or name", autocompletion=_complete_recipe),
           overrides: Optional[List[str]] = OVERRIDES_ARG,
           wait: bool = WAIT_OPT,
           workspace: Optional[str] = WS_OPT,
           max_trials: Optional[int] = typer.Option(None, "--max-trials", help="allow grids above 100,000 trials"),
           multirun: bool = MULTIRUN_OPT):
    """Expand RECIPE and run its trials in the background (completed trials never run again). A second submit of
    a recipe whose driver runs hands its new trials to that driver."""
    set_max_trials(max_trials)
    _submit(recipe, overrides or [], wait, workspace, rerun_failed=False)


@app.command(epilog="Examples:  `dpx rerun quickstart --failed` (the last submission's overrides again) · "
                    "`dpx rerun recipes/quickstart.yaml --failed seeds=[1] --wait`")
def rerun(recipe: str = typer.Argument(..., help="recipe file or name", autocompletion=_complete_recipe),
          overrides: Optional[List[str]] = typer.Argument(None, help="overrides; none: those of the recipe's last "
                                                          "submission"),
          failed: bool = typer.Option(False, "--failed", help="run failed, cancelled and missing trials again"),
          wait: bool = WAIT_OPT,
          max_trials: Optional[int] = typer.Option(None, "--max-trials", help="allow grids above 100,000 trials"),
          workspace: Optional[str] = WS_OPT):
    """Run failed, cancelled (and missing) trials of RECIPE again; completed trials are left alone."""
    set_max_trials(max_trials)
    if not failed:
        _fail("say what to rerun: `dpx rerun RECIPE --failed`")
    _submit(recipe, overrides or [], wait, workspace, rerun_failed=True)


@app.command(epilog="Examples:  `dpx watch` (the latest submission) · `dpx watch quickstart`")
def watch(recipe: Optional[str] = typer.Argument(None, help="recipe file or name (default: the latest submission)",
                                                  autocompletion=_complete_recipe),
          workspace: Optional[str] = WS_OPT):
    """Re-attach to a submission's live progress (the display of `submit --wait`), then its results."""
    ws = _ws(workspace, must_exist=True)
    store = _store(ws)
    subs = store.submissions(_recipe_name(recipe, ws)) if recipe else store.submissions()
    if not subs:
        _fail(f"{recipe or ws.root}: no submission {'of this recipe ' if recipe else ''}in {ws.root}")
    live = [s for s in subs if driver_alive(s)]
    sub = live[-1] if live else subs[-1]
    rows = store.trials(submission=sub["id"])
    points = [json.loads(r["point"] or "{}") for r in rows]
    from .trials import _varying_axes  # pydantic, omegaconf (~0.4 s): only the commands that read a recipe

    seeds = sorted({p.get("seed") for p in points if "seed" in p})
    axes = _varying_axes([{k: v for k, v in p.items() if k != "seed"} for p in points], seeds)
    out.print(f"submission {sub['id']} of {sub['recipe']} ({'live' if live else sub['state']})")
    _watch_and_report(ws, store, sub["id"], sub["recipe"], axes)


# ---- status / logs / cancel ---------------------------------------------------------------------------------
@app.command(epilog="Examples:  `dpx status` · `dpx status quickstart --trials`")
def status(recipe: Optional[str] = typer.Argument(None, help="recipe file or name (default: all)",
                                                   autocompletion=_complete_recipe),
           workspace: Optional[str] = WS_OPT,
           all_trials: bool = typer.Option(False, "--trials", help="list every trial")):
    """Done / running / pending / failed counts per recipe, and the error tails of failed trials."""
    ws = _ws(workspace, must_exist=True)
    store = _store(ws)
    name = _recipe_name(recipe, ws) if recipe else None
    if name and not store.trials(recipe=name):
        _fail(f"{recipe}: no trials of recipe {name!r} in {ws.root}")
    print_status(ws, store, name, out, all_trials)


@app.command(epilog="Examples:  `dpx logs 5ccafb` · `dpx logs 5ccafb --follow` · `dpx logs quickstart --tail 20` "
                    "(every trial of the recipe that ran)")
def logs(trial: str = typer.Argument(..., help="trial id (a unique prefix is enough), or a recipe file or name"),
         workspace: Optional[str] = WS_OPT,
         tail: int = typer.Option(0, help="only the last N lines (per trial)"),
         follow: bool = typer.Option(False, "--follow", "-f", help="keep printing while the trial runs")):
    """Print a trial's log (all attempts) with its training lines (`[train] step N  key value ...`)."""
    ws = _ws(workspace, must_exist=True)
    store = _store(ws)
    rows = store.find_trial(trial)
    if not rows:
        name = _recipe_name(trial, ws)
        rows = [r for r in store.trials(recipe=name) if r["status"] != "pending"]
        if not rows:
            _fail(f"{trial}: no such trial, and no trial of a recipe {name!r} has started")
        if follow:
            running = [r for r in rows if r["status"] == "running"]
            if len(running) != 1:
                _fail(f"{trial}: --follow takes one trial; {len(running)} of {name} are running"
                      + (": " + ", ".join(r["trial_id"] for r in running[:5]) if running else ""))
            rows = running
    elif len({(r["recipe"], r["trial_id"]) for r in rows}) > 1:
        _fail(f"{trial}: ambiguous, matches " + ", ".join(f"{r['recipe']}/{r['trial_id']}" for r in rows[:5]))
    for r in rows:
        run_dir = ws.run_dir(r["recipe"], r["trial_id"])
        if len(rows) > 1:
            print(f"===== {r['recipe']}/{r['trial_id']} ({r['status']})")
        if follow:
            def running(recipe=r["recipe"], tid=r["trial_id"]) -> bool:
                got = store.trial(recipe, tid)
                return got is not None and got["status"] in ("pending", "running")

            tlogs.follow(run_dir, running)
            continue
        if not (run_dir / LOG).exists():
            if len(rows) == 1:
                _fail(f"{run_dir / LOG}: no log yet (trial is {r['status']})", 1)
            continue
        for line in tlogs.show(run_dir, tail):
            print(line)


@app.command(epilog="Examples:  `dpx cancel quickstart` · `dpx cancel recipes/fig5_state_tracking.yaml`")
def cancel(recipe: str = typer.Argument(..., help="recipe file or name", autocompletion=_complete_recipe), workspace: Optional[str] = WS_OPT):
    """Stop a recipe's running trials and drop its pending ones (they can be rerun with `rerun --failed`)."""
    ws = _ws(workspace, must_exist=True)
    c = api_cancel(recipe, ws)
    if not c["live"]:
        out.print(f"{c['recipe']}: no live driver; {c['cancelled_pending']} pending trial(s) cancelled")
        return
    out.print(f"{c['recipe']}: cancelled ({c['cancelled']} cancelled, {c['running']} still stopping, "
              f"{c['completed']} completed kept)")


# ---- results ------------------------------------------------------------------------------------------------
FMT_OPT = typer.Option(Fmt.table, "--format", help="table | csv | json | parquet (parquet: to --out FILE or a pipe)")


@app.command(epilog="Examples:  `dpx query \"SELECT * FROM recipe_quickstart\"` · "
                    "`dpx query \"SELECT * FROM fig5\" --format csv > fig5.csv` · "
                    "`dpx query \"SELECT * FROM trials\" --format parquet --out trials.parquet`")
def query(sql: str = typer.Argument(..., help="SQL over tables trials, metrics, summary, curves, views"),
          fmt: Fmt = FMT_OPT,
          out_file: Optional[str] = typer.Option(None, "--out", help="write the rows to FILE (outside the workspace)"),
          workspace: Optional[str] = WS_OPT):
    """SQL over the results (DuckDB, read-only, no file access), rebuilt from the run dirs when they changed."""
    ws = _ws(workspace, must_exist=True)
    fmt = Fmt(fmt).value
    if fmt not in export.FORMATS:
        _fail(f"--format: {fmt!r} is not one of {', '.join(export.FORMATS)}")
    try:
        dest = export.check_out(out_file, ws.root, fmt) if out_file else None
    except RecipeError as e:
        _fail(e.line())
    if fmt == "parquet" and dest is None:
        _fail("--format parquet: needs --out FILE")
    db = refresh_duckdb(ws)
    from dpx.registry import query as rq  # duckdb: only the commands that read results load it
    from dpx.registry.db import query_arrow  # duckdb: as above

    try:
        if fmt == "parquet":
            n = export.write_export(dest, fmt, arrow_table=query_arrow(db, sql))
        else:
            cols, rows = rq(db, sql)
            n = export.write_export(dest, fmt, cols, rows) if dest else None
    except Exception as e:  # noqa: BLE001 — SQL errors are user input errors
        _fail(f"query: {str(e).splitlines()[0]}")
    if dest is not None:
        out.print(f"{n} row(s) written to {escape(str(dest))}")
        return
    _print_rows(cols, rows, fmt)


def _print_rows(cols: list[str], rows: list, fmt, out_file: Optional[str] = None) -> None:
    fmt = Fmt(fmt)
    if fmt == Fmt.parquet:
        _fail("--format parquet is for `dpx query` (with --out FILE)")
    stream = open(out_file, "w", newline="") if out_file else sys.stdout
    try:
        if fmt == Fmt.json:
            stream.write(export.to_json(cols, rows) + "\n")  # strict JSON: NaN/Infinity as null
        elif fmt == Fmt.csv:
            stream.write(export.to_csv(cols, rows))
        else:
            t = Table()
            for c in cols:
                t.add_column(str(c))
            for r in rows:
                t.add_row(*[_fmt(v) for v in r])
            con = Console(file=stream, width=200) if out_file else out
            con.print(t)
            con.print(f"{len(rows)} row(s)")
    finally:
        if out_file:
            stream.close()


@app.command(epilog="Examples:  `dpx compare fig5` · `dpx compare table2 --recipe table2_formal_languages "
                    "--format csv`")
def compare(name: str = typer.Argument(..., help="paper table or figure: table2, table3, table4, fig4, fig5, ..."),
            recipe: Optional[str] = typer.Option(None, help="only trials of this recipe"),
            fmt: Fmt = typer.Option(Fmt.table, "--format", help="table | csv | json"),
            workspace: Optional[str] = WS_OPT):
    """Our numbers beside the paper's, with deltas; rows without a run yet are marked."""
    from dpx.registry import KNOWN_NAMES  # duckdb: only the commands that read results load it
    from dpx.registry import compare as rcompare  # duckdb: as above

    if name not in KNOWN_NAMES:
        _fail(f"compare: unknown table {name!r}; known: {', '.join(KNOWN_NAMES)}")
    if fmt == Fmt.parquet:
        _fail("compare: --format parquet is for `dpx query` (use table, csv or json)")
    ws = _ws(workspace)
    if ws.exists:
        db = refresh_duckdb(ws)
    else:  # no runs yet: the paper's numbers alone, every row marked
        from dpx.registry import ingest  # duckdb: as above

        db = Path(tempfile.mkdtemp()) / "empty.duckdb"
        ingest(db, [])
    try:
        cmp = rcompare(db, name, _recipe_name(recipe, ws) if recipe else None)
    except ValueError as e:
        _fail(f"compare: {e}")
    if fmt != Fmt.table:
        _print_rows(cmp.keys(), cmp.rows, fmt)  # unique keys: fig5/fig7 repeat "paper" in the table
        return
    keep = [i for i, c in enumerate(cmp.columns) if c != "source"]  # sources: --format csv/json
    t = Table(title=cmp.title)
    for i in keep:
        t.add_column(str(cmp.columns[i]).replace(" (lower is better)", "↓").replace(" (higher is better)", "↑"))
    for r in cmp.text_rows():
        t.add_row(*[r[i] for i in keep])
    out.print(t)
    for n in cmp.notes:
        out.print(f"[dim]{n}[/dim]", highlight=False)


@app.command(epilog="Examples:  `dpx report quickstart` · `dpx report recipes/fig5_state_tracking.yaml --out f5.html`")
def report(recipe: str = typer.Argument(..., help="recipe file or name", autocompletion=_complete_recipe),
           out_html: Optional[str] = typer.Option(None, "--out", help="HTML file (default <workspace>/reports/RECIPE.html)"),
           trial_figures: int = typer.Option(40, "--trial-figures", min=0,
                                             help="figures from the run dirs to embed (0: tables and plots only)"),
           workspace: Optional[str] = WS_OPT):
    """One self-contained HTML file: the paper's tables and figures beside ours."""
    ws = _ws(workspace, must_exist=True)
    if "/" in recipe and not Path(recipe).is_file():  # a path that is no file is not a name either
        _fail(f"{recipe}: not a recipe name, nor a recipe file (pass a recipe file or name)")
    name = _recipe_name(recipe, ws)
    if out_html is None and not NAME_RE.fullmatch(name):  # it names a file under <workspace>/reports/
        _fail(f"{recipe}: not a recipe name (letters, digits, '_', '.', '-'); pass a recipe file or name")
    db = refresh_duckdb(ws)
    from dpx.registry import NothingToReport  # duckdb, matplotlib: only `dpx report` loads them
    from dpx.registry import report as rreport  # as above

    path = Path(out_html) if out_html else ws.root / "reports" / f"{name}.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        p = rreport(db, name, path, max_trial_figures=trial_figures)
    except NothingToReport as e:
        _fail(f"report: {e}", 1)
    out.print(f"report: {p}")


@app.command(epilog="Examples:  `dpx params recipes/table3.yaml` · `dpx params table4 model.num_layers=12`")
def params(recipe: str = typer.Argument(..., help="recipe file or name", autocompletion=_complete_recipe),
           overrides: Optional[List[str]] = typer.Argument(None)):
    """Each trial's parameter count and the dimension parameter matching solved for."""
    ex = _expand(recipe, overrides or [])
    from dpx.models.matching import param_report  # torch: builds the models to count their parameters

    seen: dict[str, dict] = {}
    for t in ex.trials:
        if t.config.get("model") is not None:
            seen.setdefault(json.dumps(t.config["model"], sort_keys=True), t.config["model"])
    if not seen:
        _fail(f"{recipe}: no trial of this recipe has a model")
    try:
        rows = param_report(list(seen.values()))
    except ValueError as e:
        _fail(f"{recipe}:model: {e}")
    t = Table(title=f"{ex.recipe}: parameters ({len(rows)} distinct models)")
    for c in ("family", "n_h", "hidden", "heads", "head_dim", "params", "non-emb", "reference", "diff", "mode",
              "matched"):
        t.add_column(c, justify="right" if c not in ("family", "mode", "matched") else "left")
    for r in rows:
        diff = r.get("rel_diff")
        t.add_row(r["family"], str(r["num_householder"]), str(r["hidden_size"]), str(r["num_heads"]),
                  str(r["head_dim"]), f"{r['params'] / 1e6:.2f}M", f"{r['non_embedding_params'] / 1e6:.2f}M",
                  f"{r['reference_params'] / 1e6:.2f}M" if r.get("reference_params") else "-",
                  f"{100 * diff:+.2f}%" if diff is not None else "-", str(r["mode"]), str(r["matched"] or "-"))
    out.print(t)


@app.command(epilog="Examples:  `dpx sync` · `dpx -w ./dpx_ws sync` (a workspace unpacked from a GPU node)")
def sync(workspace: Optional[str] = WS_OPT):
    """Ingest finished run dirs into MLflow (what a driver could not log) and DuckDB; idempotent."""
    ws = _ws(workspace, must_exist=True)
    _need("mlflow", "mlflow")
    n, closed = sync_mlflow(ws)
    db = refresh_duckdb(ws, force=True)
    out.print(f"MLflow: {n} trial run(s) synced, {closed} parent run(s) of dead drivers closed; DuckDB rebuilt at "
              f"{escape(str(db))}")


@app.command()
def repair(workspace: Optional[str] = WS_OPT):
    """Rebuild the state store from the run dirs after state.db was lost or damaged (completed trials stay done;
    their MLflow runs are found again, not duplicated)."""
    ws = Workspace.resolve(workspace or _GLOBAL["workspace"])  # `dpx -w DIR repair` as every other command
    if ws.root.exists() and not ws.root.is_dir():
        _fail(f"{ws.root}: not a folder (--workspace and $DPX_WORKSPACE name a workspace folder)")
    if not ws.runs.is_dir():
        _fail(f"{ws.root}: no run dirs to rebuild from ({ws.runs} does not exist)")
    repair_command(ws, out)


@app.command(epilog="Examples:  `dpx ui` · `dpx ui --port 5001 --host 0.0.0.0`")
def ui(port: int = typer.Option(5000), host: str = typer.Option("127.0.0.1"), workspace: Optional[str] = WS_OPT):
    """Serve the MLflow UI over the workspace's tracking store."""
    ws = _ws(workspace, must_exist=True)
    _need("mlflow", "mlflow")
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", ws.mlflow_uri(), "--host", host,
           "--port", str(port), "--workers", "1", "--default-artifact-root", ws.mlflow_artifacts.as_uri()]
    out.print(f"MLflow UI on {ui_url(f'http://{host}:{port}')} (Ctrl-C stops it)")  # opens in model-training view
    os.execvpe(cmd[0], cmd, env)


@app.command(epilog="Examples:  `dpx server --host 0.0.0.0 --detach` · `dpx server --stop` · "
                    "`dpx server --store postgresql://u:p@db/mlflow`")
def server(host: str = typer.Option("127.0.0.1", help="interface to listen on (0.0.0.0: every node may connect)"),
           port: int = typer.Option(5000),
           store: Optional[str] = typer.Option(None, help="SQL store URI (default sqlite:///<workspace>/mlflow.db; "
                                               "or postgresql://user:pass@host/db)"),
           artifacts: Optional[str] = typer.Option(None, help="artifact root (default <workspace>/mlruns)"),
           detach: bool = typer.Option(False, "--detach", help="start in the background and return"),
           stop_it: bool = typer.Option(False, "--stop", help="stop the server `--detach` started"),
           workspace: Optional[str] = WS_OPT):
    """Run a lean MLflow tracking server that drivers and workers on other nodes log to by URI."""
    _need("mlflow", "mlflow")
    ws = _ws(workspace).create()
    if stop_it:
        st = srv.read_state(ws)
        if not st:
            _fail(f"no detached server recorded in {srv.state_file(ws)}", 1)
        srv.stop(int(st["pid"]))
        srv.state_file(ws).unlink(missing_ok=True)
        out.print(f"stopped the MLflow server at {st['uri']} (pid {st['pid']})")
        return
    store = store or f"sqlite:///{ws.mlflow_db}"
    try:
        srv.check_store(store)
    except ValueError as e:
        _fail(f"--store: {e}")
    uri = srv.public_uri(host, port)
    log = ws.root / "server.log"
    proc = srv.start(store, artifacts or ws.mlflow_artifacts, host, port, log=log)
    try:
        took = srv.wait_healthy(f"http://{host}:{port}", proc)
    except RuntimeError as e:
        srv.stop(proc.pid)
        tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-2:])[-300:] if log.exists() else ""
        _fail(f"{e}; {log}: {tail}", 1)
    out.print(f"MLflow server up in {took:.1f}s (pid {proc.pid}), store {store}, log {log}; UI {ui_url(uri)}")
    out.print(f"tracking URI: {uri}\n  in a recipe:  tracking: {{mlflow_uri: {uri}}}\n"
              f"  or:           export DPX_MLFLOW_URI={uri}")
    if detach:
        srv.state_file(ws).write_text(json.dumps({"pid": proc.pid, "uri": uri, "store": store}))
        out.print("detached; `dpx server --stop` stops it")
        return
    try:
        proc.wait()
    except KeyboardInterrupt:
        srv.stop(proc.pid)


def _is(e: BaseException, name: str) -> bool:
    """click's exception classes by name: typer (0.29) vendors its own click, so `click.UsageError` is not them."""
    return any(c.__name__ == name for c in type(e).__mro__)


def main() -> None:
    try:
        rc = app(standalone_mode=False, prog_name="dpx")
    except RecipeError as e:  # a config class raised outside the expansion path
        err.print(f"error: {escape(e.line())}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except (OSError, __import__("sqlite3").OperationalError) as e:  # a full disk, a vanished folder: one line
        msg = " ".join(str(e).split()) or type(e).__name__
        if "disk is full" in msg or "No space left" in msg or getattr(e, "errno", None) == 28:
            msg = f"the disk is full: {msg}"
        err.print(f"error: {escape(msg)}", highlight=False, soft_wrap=True)
        sys.exit(1)
    except Exception as e:  # bad flags or values: one line, as for a bad recipe (click would draw a box)
        if not _is(e, "UsageError"):
            raise
        ctx = getattr(e, "ctx", None)
        cmd = ctx.command_path if ctx is not None else "dpx"
        msg = e.format_message().replace("Value error, ", "")
        err.print(f"error: {escape(cmd)}: {escape(msg)} (see `{escape(cmd)} --help`)",
                  highlight=False, soft_wrap=True)
        sys.exit(2)
    except BaseException as e:
        if _is(e, "Abort"):  # Ctrl-C at a prompt
            sys.exit(130)
        raise
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    main()
