"""The `dpx` command line. Every command reads the workspace (`.dpx/`, $DPX_WORKSPACE or --workspace).

Bad input (recipe file, key path, reason) is one line on stderr and exit status 2; nothing is written then.
"""
from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .errors import RecipeError
from .grid import get_dotted

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="dpx: declarative experiments for linear-RNN research.")
out = Console(width=None if sys.stdout.isatty() else 200)  # pipes and CI get wide, untruncated tables
err = Console(stderr=True, width=None if sys.stderr.isatty() else 400)

WS_OPT = typer.Option(None, "--workspace", "-w", help="workspace folder (default .dpx or $DPX_WORKSPACE)")


def _fail(msg: str, code: int = 2) -> None:
    err.print(f"[red]error:[/red] {escape(msg)}", highlight=False, soft_wrap=True)  # user text is not markup
    raise typer.Exit(code)


def _ws(path: Optional[str], must_exist: bool = False):
    from .workspace import Workspace

    ws = Workspace.resolve(path)
    if ws.root.exists() and not ws.root.is_dir():
        _fail(f"{ws.root}: not a folder (--workspace and $DPX_WORKSPACE name a workspace folder)")
    from .repair import check

    problem = check(ws)  # a damaged state store: one line; a deleted one is rebuilt from the run dirs
    if problem:
        _fail(problem)
    if must_exist and not ws.exists:
        _fail(f"{ws.root}: no dpx workspace here yet (run `dpx submit RECIPE` first, or pass --workspace)")
    return ws


def _expand(recipe: str, overrides: list[str]):
    from .trials import expand

    try:
        return expand(recipe, overrides)
    except RecipeError as e:
        _fail(e.line())


def _recipe_name(arg: str) -> str:
    """A recipe argument may be a file (its `name:` wins) or a bare name."""
    p = Path(arg)
    if p.suffix in (".yaml", ".yml") and p.exists():
        from .limits import load_yaml, read_recipe_text

        try:  # bounded: a FIFO, /dev/zero or an alias bomb named x.yaml is one line, not a hang
            data = load_yaml(read_recipe_text(p, arg), arg) or {}
        except RecipeError as e:
            if not e.reason.startswith("invalid YAML"):
                _fail(e.line())
            data = {}
        return str(data.get("name") or p.stem) if isinstance(data, dict) else p.stem
    return arg


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


# ---- expand -------------------------------------------------------------------------------------------------
@app.command()
def expand(recipe: str = typer.Argument(..., help="recipe YAML file"),
           overrides: Optional[List[str]] = typer.Argument(None, help="key=value overrides; scale=NAME"),
           fmt: str = typer.Option("table", "--format", help="table | json | ids"),
           limit: int = typer.Option(50, help="rows shown in the table (0: all)"),
           max_trials: Optional[int] = typer.Option(None, "--max-trials", help="allow grids above 100,000 trials"),
):
    """Print the trial grid (count, trial ids, the axes that vary). Runs nothing, writes nothing."""
    from .limits import set_max_trials

    set_max_trials(max_trials)
    t0 = time.perf_counter()
    ex = _expand(recipe, overrides or [])
    dt = time.perf_counter() - t0
    if fmt == "ids":
        for t in ex.trials:
            print(t.trial_id)
        return
    if fmt == "json":
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


# ---- submit / rerun -----------------------------------------------------------------------------------------
def _submit(recipe: str, overrides: list[str], wait: bool, workspace: Optional[str], rerun_failed: bool) -> None:
    from .backends import check_backend
    from .driver import spawn_driver
    from .state import StateStore

    ex = _expand(recipe, overrides)
    ws = _ws(workspace)
    try:
        check_backend(ex.meta.hardware.model_dump(), ws)
    except RecipeError as e:
        _fail(RecipeError(e.reason, recipe, e.key).line())
    ws.create()
    store = StateStore(ws.state_db)
    if rerun_failed:
        n = store.reset(ex.recipe, ("failed", "cancelled"), [t.trial_id for t in ex.trials])
        out.print(f"{n} failed/cancelled trial(s) of {ex.recipe} queued again")
    sub_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
    counts = store.add_submission(sub_id, ex.recipe, str(Path(recipe).absolute()), overrides,
                                  ex.meta.hardware.backend, ex.trials, lambda t: ws.run_dir(ex.recipe, t.trial_id))
    c = store.counts(submission=sub_id)
    todo = c["pending"] + c["running"]
    out.print(f"submission {sub_id}: {len(ex.trials)} trials ({counts['new']} new); "
              f"{c['completed']} already completed, {c['failed']} failed, {todo} to run "
              f"on {ex.meta.hardware.backend}")
    if todo == 0:
        store.update_submission(sub_id, state="done", ended_at=time.time())
        out.print("nothing to run" + (" (use `dpx rerun RECIPE --failed` for failed trials)" if c["failed"] else ""))
    else:
        pid = spawn_driver(ws, sub_id)
        store.update_submission(sub_id, driver_pid=pid, driver_host=__import__("socket").gethostname(),
                                heartbeat=time.time())
        out.print(f"driver pid {pid}; log {escape(str(ws.drivers / (sub_id + '.log')))}")  # a path is not markup
        if ex.meta.hardware.backend == "slurm" and not wait:  # return once sbatch has accepted the arrays
            from .backends.slurm import wait_accepted

            jobs = wait_accepted(store, sub_id)
            out.print(f"sbatch accepted: Slurm job {', '.join(jobs)}" if jobs else "no Slurm job yet: see `dpx status`")
    if wait:
        from .progress import watch

        watch(ws, store, sub_id, ex)
        _wait_driver(ws, store, sub_id)
        from .results import print_results

        print_results(ws, store, ex.recipe, sub_id, ex.axes, out)
        failed = store.counts(submission=sub_id)["failed"]
        raise typer.Exit(1 if failed else 0)


def _wait_driver(ws, store, sub_id: str, limit_s: float = 900) -> None:
    """After the trials: wait while the driver finishes MLflow logging, the DuckDB tables and the recipe figures,
    so that `dpx ui` / `dpx query` right after `--wait` see everything."""
    import socket

    from .state import pid_alive

    t0 = time.time()
    with err.status("finishing: MLflow logging, results tables, figures ..."):
        while time.time() - t0 < limit_s:
            sub = store.submission(sub_id)
            if sub is None or not sub["driver_pid"]:
                return
            if sub["driver_host"] == socket.gethostname():
                if not pid_alive(sub["driver_pid"]):  # the process itself, not just its last state write
                    return
            elif sub["state"] in ("done", "cancelled", "crashed"):
                return
            time.sleep(0.2)


@app.command()
def submit(recipe: str = typer.Argument(..., help="recipe YAML file"),
           overrides: Optional[List[str]] = typer.Argument(None, help="key=value overrides; scale=NAME"),
           wait: bool = typer.Option(False, "--wait", help="show live progress until the grid finishes"),
           max_trials: Optional[int] = typer.Option(None, "--max-trials", help="allow grids above 100,000 trials"),
           workspace: Optional[str] = WS_OPT):
    """Expand RECIPE and run its trials in the background (completed trials never run again)."""
    from .limits import set_max_trials

    set_max_trials(max_trials)
    _submit(recipe, overrides or [], wait, workspace, rerun_failed=False)


@app.command()
def rerun(recipe: str = typer.Argument(..., help="recipe YAML file"),
          overrides: Optional[List[str]] = typer.Argument(None),
          failed: bool = typer.Option(False, "--failed", help="run failed, cancelled and missing trials again"),
          wait: bool = typer.Option(False, "--wait"),
          max_trials: Optional[int] = typer.Option(None, "--max-trials", help="allow grids above 100,000 trials"),
          workspace: Optional[str] = WS_OPT):
    """Run failed (and missing) trials of RECIPE again; completed trials are left alone."""
    from .limits import set_max_trials

    set_max_trials(max_trials)
    if not failed:
        _fail("say what to rerun: `dpx rerun RECIPE --failed`")
    _submit(recipe, overrides or [], wait, workspace, rerun_failed=True)


# ---- status / logs / cancel ---------------------------------------------------------------------------------
@app.command()
def status(recipe: Optional[str] = typer.Argument(None, help="recipe file or name (default: all)"),
           workspace: Optional[str] = WS_OPT,
           all_trials: bool = typer.Option(False, "--trials", help="list every trial")):
    """Done / running / pending / failed counts per recipe, and the error tails of failed trials."""
    from .results import print_status
    from .state import StateStore

    ws = _ws(workspace, must_exist=True)
    store = StateStore(ws.state_db)
    name = _recipe_name(recipe) if recipe else None
    if name and not store.trials(recipe=name):
        _fail(f"{recipe}: no trials of recipe {name!r} in {ws.root}")
    print_status(ws, store, name, out, all_trials)


@app.command()
def logs(trial: str = typer.Argument(..., help="trial id (a unique prefix is enough)"),
         workspace: Optional[str] = WS_OPT,
         tail: int = typer.Option(0, help="only the last N lines")):
    """Print a trial's log (all attempts)."""
    from .state import StateStore

    ws = _ws(workspace, must_exist=True)
    rows = StateStore(ws.state_db).find_trial(trial)
    if not rows:
        _fail(f"{trial}: no such trial")
    if len({(r["recipe"], r["trial_id"]) for r in rows}) > 1:
        _fail(f"{trial}: ambiguous, matches " + ", ".join(f"{r['recipe']}/{r['trial_id']}" for r in rows[:5]))
    path = ws.run_dir(rows[0]["recipe"], rows[0]["trial_id"]) / "log.txt"
    if not path.exists():
        _fail(f"{path}: no log yet (trial is {rows[0]['status']})", 1)
    text = path.read_text(errors="replace")
    if tail:
        text = "\n".join(text.splitlines()[-tail:])
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


@app.command()
def cancel(recipe: str = typer.Argument(..., help="recipe file or name"), workspace: Optional[str] = WS_OPT):
    """Stop a recipe's running trials and drop its pending ones (they can be rerun with `rerun --failed`)."""
    from .driver import driver_alive
    from .state import StateStore

    ws = _ws(workspace, must_exist=True)
    store = StateStore(ws.state_db)
    name = _recipe_name(recipe)
    subs = [s for s in store.submissions(name) if s["state"] in ("starting", "running")]
    for s in subs:  # compare-and-set: a submission that ended meanwhile keeps its final state
        store.update_submission(s["id"], expect_state=("starting", "running"), state="cancelling")
    live = [s for s in subs if driver_alive(s) or s["state"] == "starting"]
    if not live:  # no driver to do it: cancel pending trials here
        with store.tx() as c:
            n = c.execute("UPDATE trials SET status='cancelled', error='cancelled by user', updated_at=? "
                          "WHERE recipe=? AND status='pending'", (time.time(), name)).rowcount
        out.print(f"{name}: no live driver; {n} pending trial(s) cancelled")
        return
    deadline = time.time() + 60
    while time.time() < deadline and store.counts(recipe=name)["running"]:
        time.sleep(0.5)
    c = store.counts(recipe=name)
    out.print(f"{name}: cancelled ({c['cancelled']} cancelled, {c['running']} still stopping, "
              f"{c['completed']} completed kept)")


# ---- results ------------------------------------------------------------------------------------------------
@app.command()
def query(sql: str = typer.Argument(..., help="SQL over tables trials, metrics, summary, curves, views"),
          fmt: str = typer.Option("table", "--format", help="table | csv | json | parquet (parquet needs --out)"),
          out_file: Optional[str] = typer.Option(None, "--out", help="write the rows to FILE (outside the workspace)"),
          workspace: Optional[str] = WS_OPT):
    """SQL over the results (DuckDB, read-only, no file access), rebuilt from the run dirs when they changed."""
    from . import export
    from .results import refresh_duckdb

    ws = _ws(workspace, must_exist=True)
    if fmt not in export.FORMATS:
        _fail(f"--format: {fmt!r} is not one of {', '.join(export.FORMATS)}")
    try:
        dest = export.check_out(out_file, ws.root, fmt) if out_file else None
    except RecipeError as e:
        _fail(e.line())
    if fmt == "parquet" and dest is None:
        _fail("--format parquet: needs --out FILE")
    db = refresh_duckdb(ws)
    from dpx.registry import query as rq
    from dpx.registry.db import query_arrow

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


def _print_rows(cols: list[str], rows: list, fmt: str) -> None:
    from . import export

    if fmt == "json":
        print(export.to_json(cols, rows))  # strict JSON: NaN/Infinity as null
    elif fmt == "csv":
        sys.stdout.write(export.to_csv(cols, rows))
    else:
        t = Table()
        for c in cols:
            t.add_column(str(c))
        for r in rows:
            t.add_row(*[_fmt(v) for v in r])
        out.print(t)
        out.print(f"{len(rows)} row(s)")


@app.command()
def compare(name: str = typer.Argument(..., help="paper table or figure: table2, table3, table4, fig4, fig5, ..."),
            recipe: Optional[str] = typer.Option(None, help="only trials of this recipe"),
            fmt: str = typer.Option("table", "--format", help="table | csv | json"),
            workspace: Optional[str] = WS_OPT):
    """Our numbers beside the paper's, with deltas; rows without a run yet are marked."""
    from dpx.registry import KNOWN_NAMES
    from dpx.registry import compare as rcompare

    if name not in KNOWN_NAMES:
        _fail(f"compare: unknown table {name!r}; known: {', '.join(KNOWN_NAMES)}")
    ws = _ws(workspace)
    if ws.exists:
        from .results import refresh_duckdb

        db = refresh_duckdb(ws)
    else:  # no runs yet: the paper's numbers alone, every row marked
        import tempfile

        from dpx.registry import ingest

        db = Path(tempfile.mkdtemp()) / "empty.duckdb"
        ingest(db, [])
    try:
        cmp = rcompare(db, name, _recipe_name(recipe) if recipe else None)
    except ValueError as e:
        _fail(f"compare: {e}")
    if fmt != "table":
        _print_rows(cmp.columns, cmp.rows, fmt)
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


@app.command()
def report(recipe: str = typer.Argument(..., help="recipe file or name"),
           out_html: Optional[str] = typer.Option(None, "--out", help="HTML file (default <workspace>/reports/RECIPE.html)"),
           workspace: Optional[str] = WS_OPT):
    """One self-contained HTML file: the paper's tables and figures beside ours."""
    from .results import refresh_duckdb

    ws = _ws(workspace, must_exist=True)
    name = _recipe_name(recipe)
    from .limits import NAME_RE

    if out_html is None and not NAME_RE.fullmatch(name):  # it names a file under <workspace>/reports/
        _fail(f"{recipe}: not a recipe name (letters, digits, '_', '.', '-'); pass a recipe file or name")
    db = refresh_duckdb(ws)
    from dpx.registry import NothingToReport
    from dpx.registry import report as rreport

    path = Path(out_html) if out_html else ws.root / "reports" / f"{name}.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        p = rreport(db, name, path)
    except NothingToReport as e:
        _fail(f"report: {e}", 1)
    out.print(f"report: {p}")


@app.command()
def params(recipe: str = typer.Argument(..., help="recipe YAML file"),
           overrides: Optional[List[str]] = typer.Argument(None)):
    """Each trial's parameter count and the dimension parameter matching solved for."""
    ex = _expand(recipe, overrides or [])
    from dpx.models.matching import param_report

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


@app.command()
def sync(workspace: Optional[str] = WS_OPT):
    """Ingest finished run dirs into MLflow (what a driver could not log) and DuckDB; idempotent."""
    from .results import refresh_duckdb, sync_mlflow

    ws = _ws(workspace, must_exist=True)
    n, closed = sync_mlflow(ws)
    db = refresh_duckdb(ws, force=True)
    out.print(f"MLflow: {n} trial run(s) synced, {closed} parent run(s) of dead drivers closed; DuckDB rebuilt at "
              f"{escape(str(db))}")


@app.command()
def repair(workspace: Optional[str] = WS_OPT):
    """Rebuild the state store from the run dirs after state.db was lost or damaged (completed trials stay done;
    their MLflow runs are found again, not duplicated)."""
    from .repair import repair_command
    from .workspace import Workspace

    ws = Workspace.resolve(workspace)
    if ws.root.exists() and not ws.root.is_dir():
        _fail(f"{ws.root}: not a folder (--workspace and $DPX_WORKSPACE name a workspace folder)")
    if not ws.runs.is_dir():
        _fail(f"{ws.root}: no run dirs to rebuild from ({ws.runs} does not exist)")
    repair_command(ws, out)


@app.command()
def ui(port: int = typer.Option(5000), host: str = typer.Option("127.0.0.1"), workspace: Optional[str] = WS_OPT):
    """Serve the MLflow UI over the workspace's tracking store."""
    ws = _ws(workspace, must_exist=True)
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", ws.mlflow_uri(), "--host", host,
           "--port", str(port), "--workers", "1", "--default-artifact-root", ws.mlflow_artifacts.as_uri()]
    out.print(f"MLflow UI on http://{host}:{port} (Ctrl-C stops it)")
    os.execvpe(cmd[0], cmd, env)


@app.command()
def server(host: str = typer.Option("127.0.0.1", help="interface to listen on (0.0.0.0: every node may connect)"),
           port: int = typer.Option(5000),
           store: Optional[str] = typer.Option(None, help="SQL store URI (default sqlite:///<workspace>/mlflow.db; "
                                               "or postgresql://user:pass@host/db)"),
           artifacts: Optional[str] = typer.Option(None, help="artifact root (default <workspace>/mlruns)"),
           detach: bool = typer.Option(False, "--detach", help="start in the background and return"),
           stop_it: bool = typer.Option(False, "--stop", help="stop the server `--detach` started"),
           workspace: Optional[str] = WS_OPT):
    """Run a lean MLflow tracking server that drivers and workers on other nodes log to by URI."""
    from . import server as srv

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
    out.print(f"MLflow server up in {took:.1f}s (pid {proc.pid}), store {store}, log {log}")
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


def main() -> None:
    try:
        app()
    except RecipeError as e:  # a config class raised outside the expansion path
        err.print(f"error: {escape(e.line())}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except (OSError, __import__("sqlite3").OperationalError) as e:  # a full disk, a vanished folder: one line
        msg = " ".join(str(e).split()) or type(e).__name__
        if "disk is full" in msg or "No space left" in msg or getattr(e, "errno", None) == 28:
            msg = f"the disk is full: {msg}"
        err.print(f"error: {escape(msg)}", highlight=False, soft_wrap=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
