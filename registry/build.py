"""Build the results database from run dirs: `ingest(db_path, trials) -> stats`.

Every call rebuilds the whole file from the run dirs (the source of truth), so ingesting twice gives the same
rows and nothing is ever duplicated. The new database is written to a temporary file beside `db_path` and moved
over it with os.replace: readers (`dpx query`, opened read-only) keep the old inode until they close and never
see a half-built or locked file; two concurrent ingests each finish and the last rename wins.
Run dirs are only read. Damage (truncated metrics.jsonl, missing result.json) becomes a warning in the stats and
in the `ingest_warnings` table; the trial's good parts and all other trials are still ingested.
"""
from __future__ import annotations

import functools
import json
import math
import os
import time
import uuid
from pathlib import Path
from typing import Any

import duckdb
import numpy as np

from . import keys as K
from . import reference, views
from .rundir import RunDirData, read_run_dir

SECTIONS = ("model", "task", "train", "eval", "hardware")
SCHEMA_VERSION = 5  # bump when tables or views change; is_current() tells callers to rebuild

# Fixed columns of `trials` (name, SQL type). Flattened config columns (`model__num_householder`, ...) follow.
TRIAL_COLUMNS: list[tuple[str, str]] = [
    ("trial_id", "VARCHAR"), ("recipe", "VARCHAR"), ("status", "VARCHAR"), ("attempts", "INTEGER"),
    ("seed", "BIGINT"), ("config_version", "BIGINT"),
    ("model_label", "VARCHAR"), ("n_h", "INTEGER"), ("gated", "BOOLEAN"), ("beta_range", "VARCHAR"),
    ("num_layers", "INTEGER"), ("num_heads", "INTEGER"), ("size_label", "VARCHAR"), ("matching", "VARCHAR"),
    ("task_name", "VARCHAR"), ("group_name", "VARCHAR"), ("language", "VARCHAR"), ("dataset", "VARCHAR"),
    ("train_len", "INTEGER"), ("seq_len", "INTEGER"), ("batch_size", "INTEGER"), ("impl", "VARCHAR"),
    ("num_params", "DOUBLE"),
    ("submitted_at", "TIMESTAMP"), ("started_at", "TIMESTAMP"), ("ended_at", "TIMESTAMP"),
    ("duration_s", "DOUBLE"), ("host", "VARCHAR"), ("device", "VARCHAR"), ("mlflow_run_id", "VARCHAR"),
    ("error", "VARCHAR"), ("run_dir", "VARCHAR"), ("n_warnings", "INTEGER"), ("config", "JSON"),
]
TIME_COLUMNS = {"submitted_at", "started_at", "ended_at"}


def flatten_config(cfg: dict) -> dict[str, Any]:
    """{"model": {"num_householder": 2}} -> {"model__num_householder": 2}: section__key, nested dicts joined by
    '__', characters other than [A-Za-z0-9_] replaced by '_'. Lists stay one value (stored as JSON text)."""
    out: dict[str, Any] = {}

    def walk(prefix: str, v: Any) -> None:
        if isinstance(v, dict):  # an empty mapping adds no column (it stays in the config JSON)
            for k, vv in v.items():
                walk(f"{prefix}__{_safe(str(k))}", vv)
        else:
            name, i = prefix, 2
            while name in out:  # `a-b` and `a_b` both map to `a_b`: the second becomes `a_b_2`, not lost
                name, i = f"{prefix}_{i}", i + 1
            out[name] = v

    for sec in SECTIONS:
        if isinstance(cfg.get(sec), dict):
            walk(sec, cfg[sec])
    return out


@functools.lru_cache(maxsize=65536)  # the same few hundred keys in every trial: 50,000 trials call this millions of times
def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)


def _sql_type(values: list[Any]) -> str:
    vals = [v for v in values if v is not None]
    if vals and all(isinstance(v, bool) for v in vals):
        return "BOOLEAN"
    if vals and all(isinstance(v, int) and not isinstance(v, bool) for v in vals):
        return "BIGINT"
    if vals and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
        return "DOUBLE"
    return "VARCHAR"


def _text(v: Any, sql_type: str) -> str | None:
    """Stage every value as text; the INSERT casts it to the column's type (exact for ints, JSON for lists)."""
    if v is None:
        return None
    if isinstance(v, float) and math.isnan(v):
        return None
    if sql_type == "BOOLEAN":
        return "true" if v else "false"
    if sql_type in ("BIGINT", "DOUBLE"):
        try:
            return repr(float(v)) if isinstance(v, float) or sql_type == "DOUBLE" else str(int(v))
        except (TypeError, ValueError):  # e.g. a string seed in a hand-written config: NULL, not a crash
            return None
    if sql_type == "JSON":
        return json.dumps(v, sort_keys=True, default=str)
    return v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str)


def _flatten_summary(metrics: Any, prefix: str = "") -> list[tuple[str, float | None, str]]:
    out = []
    if not isinstance(metrics, dict):
        return out
    for k, v in metrics.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out += _flatten_summary(v, key + "/")
            continue
        num = None
        if isinstance(v, (int, float)):
            num = float(v)
            num = None if math.isnan(num) else num
        out.append((key, num, json.dumps(v, default=str, allow_nan=True)))
    return out


def _insert(con: duckdb.DuckDBPyConnection, table: str, cols: list[tuple[str, str]], rows: list[tuple]) -> int:
    """Bulk insert through a registered dict of numpy arrays (executemany is ~1000x slower in DuckDB)."""
    if not rows:
        return 0
    data = {}
    for i, (name, typ) in enumerate(cols):
        vals = [r[i] for r in rows]
        if typ in ("DOUBLE",) or all(v is None for v in vals):
            # NaN in a float64 array arrives in DuckDB as NULL. An all-None object array of >= 2,000 rows cannot
            # be registered at all (DuckDB 1.5's object-column analysis fails on it), so all-NULL columns of any
            # type are staged this way too; the TRY_CAST below gives the column's type.
            data[f"c{i}"] = np.array([np.nan if v is None else float(v) for v in vals], dtype=np.float64)
        else:
            data[f"c{i}"] = np.array(vals, dtype=object)
    con.register("_buf", data)
    # TRY_CAST: a value that does not fit its column (hand-edited config, odd state row) becomes NULL
    sel = ", ".join(f"TRY_CAST(c{i} AS {typ})" for i, (_, typ) in enumerate(cols))
    con.execute(f"INSERT INTO {table} ({', '.join(views.ident(n) for n, _ in cols)}) SELECT {sel} FROM _buf")
    con.unregister("_buf")
    return len(rows)


def _epoch(v: Any) -> float | None:
    try:
        return float(v) if v is not None else None
    except (TypeError, ValueError):
        return None


METRIC_COLUMNS = "{key: 'VARCHAR', value: 'DOUBLE', step: 'DOUBLE', time: 'DOUBLE', kind: 'VARCHAR'}"


def _load_metrics(con: duckdb.DuckDBPyConnection, tid: str, data: RunDirData) -> None:
    """metrics.jsonl -> `metrics` (kind scalar) and `curves` (kind curve). An unreadable line (a worker killed
    mid-write, or still writing) comes back from DuckDB as an all-NULL row: it is counted, warned, skipped.
    null and NaN values are stored as NULL."""
    path = data.metrics_path
    try:
        con.execute("CREATE OR REPLACE TEMP TABLE raw AS SELECT * FROM read_json(?, format = 'newline_delimited', "
                    f"ignore_errors = true, columns = {METRIC_COLUMNS})", [str(path)])
    except duckdb.Error as e:
        data.warnings.append(f"{path}: unreadable ({str(e).splitlines()[0][:100]}); no metrics from this trial")
        return
    clean = "CASE WHEN isnan(value) THEN NULL ELSE value END"
    con.execute(f"INSERT INTO metrics SELECT ?, key, CAST(step AS BIGINT), {clean}, time, 'scalar' FROM raw "
                "WHERE key IS NOT NULL AND coalesce(kind, 'scalar') <> 'curve'", [tid])
    con.execute(f"INSERT INTO curves SELECT ?, key, step, {clean} FROM raw WHERE key IS NOT NULL AND kind = 'curve'",
                [tid])
    bad = con.execute("SELECT count(*) FROM raw WHERE key IS NULL").fetchone()[0]
    con.execute("DROP TABLE raw")
    if bad:
        _warn_bad_lines(data, bad)


METRICS_BATCH_FILES = 2000  # metrics.jsonl files read by one read_json call
METRICS_BATCH_BYTES = 256 << 20


def _load_all_metrics(con: duckdb.DuckDBPyConnection, items: list[tuple[str, RunDirData]]) -> None:
    """metrics.jsonl of many trials, a batch of files per read_json call (one call per trial made 50,000 trials
    take minutes). A batch that DuckDB cannot read as a whole (a file vanished or unreadable) is read file by
    file, so the damage stays a warning on its own trial."""
    batch: list[tuple[str, RunDirData]] = []
    size = 0
    for tid, data in items:
        try:
            n = data.metrics_path.stat().st_size
        except OSError:
            n = 0
        if batch and (len(batch) >= METRICS_BATCH_FILES or size + n > METRICS_BATCH_BYTES):
            _load_metrics_batch(con, batch)
            batch, size = [], 0
        batch.append((tid, data))
        size += n
    if batch:
        _load_metrics_batch(con, batch)


def _load_metrics_batch(con: duckdb.DuckDBPyConnection, batch: list[tuple[str, RunDirData]]) -> None:
    if len(batch) == 1:
        _load_metrics(con, *batch[0])
        return
    paths = [str(d.metrics_path) for _, d in batch]
    try:
        con.execute("CREATE OR REPLACE TEMP TABLE raw AS SELECT *, row_number() OVER () AS _rn FROM read_json(?, "
                    f"format = 'newline_delimited', ignore_errors = true, filename = '_file', columns = {METRIC_COLUMNS})",
                    [paths])
    except duckdb.Error:
        for item in batch:
            _load_metrics(con, *item)
        return
    con.execute("CREATE OR REPLACE TEMP TABLE raw_ids (_file VARCHAR, tid VARCHAR)")
    _insert(con, "raw_ids", [("_file", "VARCHAR"), ("tid", "VARCHAR")], [(p, tid) for p, (tid, _) in zip(paths, batch)])
    clean = "CASE WHEN isnan(value) THEN NULL ELSE value END"
    con.execute(f"INSERT INTO metrics SELECT i.tid, key, CAST(step AS BIGINT), {clean}, time, 'scalar' FROM raw "
                "JOIN raw_ids i USING (_file) WHERE key IS NOT NULL AND coalesce(kind, 'scalar') <> 'curve' ORDER BY _rn")
    con.execute(f"INSERT INTO curves SELECT i.tid, key, step, {clean} FROM raw JOIN raw_ids i USING (_file) "
                "WHERE key IS NOT NULL AND kind = 'curve' ORDER BY _rn")
    bad = dict(con.execute("SELECT _file, count(*) FROM raw WHERE key IS NULL GROUP BY ALL").fetchall())
    con.execute("DROP TABLE raw")
    con.execute("DROP TABLE raw_ids")
    for p, (_, data) in zip(paths, batch):
        if bad.get(p):
            _warn_bad_lines(data, bad[p])


def _warn_bad_lines(data: RunDirData, bad: int) -> None:
    path = data.metrics_path
    where = ""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 65536))
            tail = f.read()
        if not tail.endswith(b"\n"):
            json.loads(tail.rsplit(b"\n", 1)[-1])
    except ValueError:
        where = " (the last line is truncated: the worker was killed mid-write or is still writing)"
    except OSError:
        pass
    data.warnings.append(f"{path}: {bad} unreadable line(s) skipped{where}")


def _dedupe_column_names(flats: list[dict[str, Any]], stats: dict, warn_rows: list) -> None:
    """DuckDB column names are case-insensitive: `eval.extra: {Foo: 1}` in one trial and `{foo: 2}` in another
    would make two columns of one name and kill every build. The second spelling (in sorted order) is renamed
    `<name>_2` (`_3`, ...) in every trial, with a warning; the values stay in `config` as they were."""
    taken = {n.lower() for n, _ in TRIAL_COLUMNS}
    rename: dict[str, str] = {}
    for name in sorted({k for f in flats for k in f}):
        new, i = name, 2
        while new.lower() in taken:
            new, i = f"{name}_{i}", i + 1
        taken.add(new.lower())
        if new != name:
            rename[name] = new
            msg = (f"config column {name!r} differs only in case from another one (DuckDB names are "
                   f"case-insensitive); stored as {new!r}")
            stats["warnings"].append(msg)
            warn_rows.append((None, msg))
    if rename:
        for f in flats:
            for old in [k for k in f if k in rename]:
                f[rename[old]] = f.pop(old)


def _create_paper_tables(con: duckdb.DuckDBPyConnection) -> None:
    long_rows = []
    for name in ("table2", "table3", "table4", "table5", "fig5"):
        cols, rows = reference.load_table(name)
        types = [("VARCHAR" if c in reference.TEXT_COLUMNS else "DOUBLE") for c in cols]
        if name == "fig5":
            types = ["VARCHAR" if c in reference.TEXT_COLUMNS else "INTEGER" for c in cols]
        con.execute(f"CREATE TABLE paper_{name} ({', '.join(f'{views.ident(c)} {t}' for c, t in zip(cols, types))})")
        _insert(con, f"paper_{name}", list(zip(cols, types)), [tuple(_text(v, t) if t != "DOUBLE" else v
                                                                        for v, t in zip(r, types)) for r in rows])
        row_key_cols = [c for c in cols if c in ("size", "model", "beta_range", "group")]
        for r in rows:
            d = dict(zip(cols, r))
            rk = " | ".join(str(d[c]) for c in row_key_cols)
            for c, v in d.items():
                if c not in reference.TEXT_COLUMNS and v is not None:
                    long_rows.append((name, rk, c, float(v), d["source"], d.get("note")))
    con.execute("CREATE TABLE paper (name VARCHAR, row_key VARCHAR, column_name VARCHAR, value DOUBLE, "
                "source VARCHAR, note VARCHAR)")
    _insert(con, "paper", [("name", "VARCHAR"), ("row_key", "VARCHAR"), ("column_name", "VARCHAR"),
                           ("value", "DOUBLE"), ("source", "VARCHAR"), ("note", "VARCHAR")], long_rows)
    figs = reference.load_figures()
    claims, settings = [], []
    for fig, spec in figs.items():
        for c in spec.get("claims", []):
            claims.append((fig, c["id"], c["text"], c["source"]))
        for k, v in spec.get("settings", {}).items():
            settings.append((fig, k, json.dumps(v)))
    con.execute("CREATE TABLE paper_claims (figure VARCHAR, id VARCHAR, text VARCHAR, source VARCHAR)")
    _insert(con, "paper_claims", [("figure", "VARCHAR"), ("id", "VARCHAR"), ("text", "VARCHAR"),
                                  ("source", "VARCHAR")], claims)
    con.execute("CREATE TABLE paper_settings (figure VARCHAR, key VARCHAR, value JSON)")
    _insert(con, "paper_settings", [("figure", "VARCHAR"), ("key", "VARCHAR"), ("value", "JSON")], settings)


def _trial_row(t: dict, data: RunDirData) -> tuple[dict[str, Any], dict[str, Any]]:
    cfg = t.get("config") or data.config or {}
    if not isinstance(cfg, dict):
        data.warnings.append(f"trial {t.get('trial_id')}: config is not a mapping; ignored")
        cfg = {}
    result = data.result or {}
    summary = result.get("metrics") if isinstance(result.get("metrics"), dict) else {}
    num_params = summary.get(K.NUM_PARAMS)
    num_params = float(num_params) if isinstance(num_params, (int, float)) and not isinstance(num_params, bool) else None
    recipe = t.get("recipe") or cfg.get("recipe")
    try:
        ident = K.identity(cfg, recipe or "", num_params)
    except Exception as e:  # a config shape keys.py did not foresee must not stop the ingest
        data.warnings.append(f"trial {t.get('trial_id')}: paper-row identity failed ({type(e).__name__}: {e})")
        ident = {}
    started = _epoch(t.get("started_at")) or _epoch(result.get("started_at"))
    ended = _epoch(t.get("ended_at")) or _epoch(result.get("ended_at"))
    err = t.get("error") or (data.error or {}).get("error")
    row = {
        "trial_id": t["trial_id"], "recipe": recipe, "status": t.get("status"), "attempts": t.get("attempts"),
        "seed": cfg.get("seed"), "config_version": cfg.get("version"), **ident, "num_params": num_params,
        "submitted_at": _epoch(t.get("submitted_at")), "started_at": started, "ended_at": ended,
        "duration_s": (ended - started) if started is not None and ended is not None else None,
        "host": t.get("host") or result.get("host"), "device": t.get("device") or result.get("device"),
        "mlflow_run_id": t.get("mlflow_run_id"), "error": str(err).splitlines()[0] if err else None,
        "run_dir": str(t.get("run_dir")) if t.get("run_dir") else None, "n_warnings": len(data.warnings),
        "config": cfg,
    }
    return row, flatten_config(cfg)


def _pick(entries: list[dict]) -> dict:
    """The state row whose run dir feeds a trial shared by several recipes (same config, same id): a completed
    one first, else the last listed (the newest)."""
    done = [e for e in entries if e.get("status") == "completed"]
    return done[0] if done else entries[-1]


def _build(con: duckdb.DuckDBPyConnection, trials: list[dict], stats: dict) -> None:
    _create_paper_tables(con)
    by_id: dict[str, list[dict]] = {}
    for t in trials:
        tid = t.get("trial_id")
        if not tid:
            stats["warnings"].append(f"trial without trial_id skipped: {str(t)[:80]}")
            continue
        by_id.setdefault(tid, []).append(t)
    # membership: a trial id may belong to several recipes (two recipes sharing a config share its id); each
    # (recipe, trial_id) pair is kept in `trial_recipes`, and the recipe views select through it
    members: dict[tuple[str, str], dict] = {}
    seen: dict[str, dict] = {}
    for tid, entries in by_id.items():
        for e in entries:
            cfg = e.get("config") if isinstance(e.get("config"), dict) else {}
            rec = e.get("recipe") or cfg.get("recipe")
            key = (str(rec) if rec else "", tid)
            if key in members:
                stats["warnings"].append(f"trial {tid} listed twice in recipe {rec}; the last entry is kept")
            members[key] = e
        seen[tid] = _pick(entries)

    con.execute("CREATE TABLE metrics (trial_id VARCHAR, key VARCHAR, step BIGINT, value DOUBLE, time DOUBLE, "
                "kind VARCHAR)")
    con.execute("CREATE TABLE curves (trial_id VARCHAR, key VARCHAR, x DOUBLE, y DOUBLE)")
    rows, flats, summary, figures, warn_rows = [], [], [], [], []
    datas: list[tuple[str, RunDirData]] = []
    for tid, t in seen.items():
        datas.append((tid, read_run_dir(t.get("run_dir"), expect_result=t.get("status") == "completed")))
    _load_all_metrics(con, [(tid, d) for tid, d in datas if d.metrics_path is not None])
    for (tid, data), t in zip(datas, seen.values()):
        row, flat = _trial_row(t, data)
        rows.append(row)
        flats.append(flat)
        if data.result is not None:
            summary += [(tid, k, v, j) for k, v, j in _flatten_summary(data.result.get("metrics"))]
        figures += [(tid, p.stem, str(p), size) for p, size in data.figures]
        warn_rows += [(tid, w) for w in data.warnings]
        stats["warnings"] += [f"trial {tid}: {w}" for w in data.warnings]
    _dedupe_column_names(flats, stats, warn_rows)

    # trials: fixed columns + the union of flattened config columns, typed by their values across trials.
    flat_names = sorted({k for f in flats for k in f})
    flat_types = {n: _sql_type([f.get(n) for f in flats]) for n in flat_names}
    cols = TRIAL_COLUMNS + [(n, flat_types[n]) for n in flat_names]
    con.execute("CREATE TABLE trials (" + ", ".join(f"{views.ident(n)} {t}" for n, t in cols)
                + ", PRIMARY KEY (trial_id))")
    staged = []
    for row, flat in zip(rows, flats):
        vals = []
        for n, typ in cols:
            v = row.get(n) if n in row else flat.get(n)
            vals.append(v if n in TIME_COLUMNS else _text(v, typ))
        staged.append(tuple(vals))
    # timestamps are staged as unix seconds and converted by the INSERT below (UTC, naive TIMESTAMP)
    stage_cols = [(n, "DOUBLE" if n in TIME_COLUMNS else t) for n, t in cols]
    stats["trials"] = len(staged)
    con.execute("CREATE TEMP TABLE trials_stage AS SELECT * FROM trials LIMIT 0")
    for n in TIME_COLUMNS:
        con.execute(f"ALTER TABLE trials_stage ALTER {n} TYPE DOUBLE")
    _insert(con, "trials_stage", stage_cols, staged)
    sel = ", ".join(f"epoch_ms(CAST({n} * 1000 AS BIGINT))" if n in TIME_COLUMNS else views.ident(n)
                    for n, _ in cols)
    con.execute(f"INSERT INTO trials SELECT {sel} FROM trials_stage")
    con.execute("DROP TABLE trials_stage")

    stats["metrics"] = con.execute("SELECT count(*) FROM metrics").fetchone()[0]
    stats["curves"] = con.execute("SELECT count(*) FROM curves").fetchone()[0]
    con.execute("CREATE TABLE summary (trial_id VARCHAR, key VARCHAR, value DOUBLE, value_json JSON)")
    stats["summary"] = _insert(con, "summary", [("trial_id", "VARCHAR"), ("key", "VARCHAR"), ("value", "DOUBLE"),
                                                ("value_json", "JSON")], summary)
    con.execute("CREATE TABLE figures (trial_id VARCHAR, name VARCHAR, path VARCHAR, bytes BIGINT)")
    stats["figures"] = _insert(con, "figures", [("trial_id", "VARCHAR"), ("name", "VARCHAR"), ("path", "VARCHAR"),
                                                ("bytes", "BIGINT")], figures)
    con.execute("CREATE TABLE ingest_warnings (trial_id VARCHAR, message VARCHAR)")
    _insert(con, "ingest_warnings", [("trial_id", "VARCHAR"), ("message", "VARCHAR")], warn_rows)

    for name, sql in views.PAPER_VIEWS.items():
        con.execute(f"CREATE VIEW {name} AS {sql()}")
    con.execute("CREATE TABLE trial_recipes (recipe VARCHAR, trial_id VARCHAR, status VARCHAR, run_dir VARCHAR, "
                "PRIMARY KEY (recipe, trial_id))")
    _insert(con, "trial_recipes", [("recipe", "VARCHAR"), ("trial_id", "VARCHAR"), ("status", "VARCHAR"),
                                   ("run_dir", "VARCHAR")],
            [(rec, tid, e.get("status"), str(e.get("run_dir")) if e.get("run_dir") else None)
             for (rec, tid), e in members.items() if rec])
    recipes = sorted({rec for rec, _ in members if rec})
    taken: set[str] = set(views.PAPER_VIEWS)
    con.execute("CREATE TABLE recipes (recipe VARCHAR, view_name VARCHAR, n_trials INTEGER)")
    index = {r["trial_id"]: (r, f) for r, f in zip(rows, flats)}
    of_recipe: dict[str, set[str]] = {}
    for rec, tid in members:
        if rec:
            of_recipe.setdefault(rec, set()).add(tid)
    skeys_of: dict[str, set[str]] = {}
    for tid, k, _, _ in summary:
        skeys_of.setdefault(tid, set()).add(k)
    for recipe in recipes:
        ids = of_recipe[recipe]
        mine = [index[tid] for tid in ids]
        cfg_cols = sorted({k for _, f in mine for k, v in f.items() if v is not None})
        skeys = sorted({k for tid in ids for k in skeys_of.get(tid, ())})
        view = views.view_name_for_recipe(recipe, taken)
        taken.add(view)
        con.execute(f"CREATE VIEW {views.ident(view)} AS {views.recipe_view(recipe, cfg_cols, skeys)}")
        con.execute("INSERT INTO recipes VALUES (?, ?, ?)", [recipe, view, len(ids)])
    stats["recipes"] = recipes
    con.execute("CREATE TABLE meta (key VARCHAR, value VARCHAR)")
    con.execute("INSERT INTO meta VALUES ('schema_version', ?), ('built_at', ?), ('trials', ?)",
                [str(SCHEMA_VERSION), str(time.time()), str(len(rows))])


def is_current(db_path: str | os.PathLike) -> bool:
    """True when db_path exists and was built by this version's schema (else: ingest again)."""
    if not Path(db_path).exists():
        return False
    try:
        con = duckdb.connect(str(db_path), read_only=True)
        try:
            row = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        finally:
            con.close()
    except duckdb.Error:
        return False
    return row is not None and row[0] == str(SCHEMA_VERSION)


def ingest(db_path: str | os.PathLike, trials: list[dict]) -> dict:
    """(Re)build the DuckDB file at db_path from the trials' run dirs; return counts and warnings."""
    t0 = time.time()
    db_path = Path(db_path)
    db_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = db_path.with_name(f".{db_path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    stats: dict[str, Any] = {"db_path": str(db_path), "warnings": []}
    con = duckdb.connect(str(tmp), config={"autoinstall_known_extensions": False})
    try:
        con.execute("BEGIN TRANSACTION")  # one commit for the whole build
        _build(con, trials, stats)
        con.execute("COMMIT")
        con.execute("CHECKPOINT")
        con.close()
        stale_wal = Path(str(db_path) + ".wal")
        if stale_wal.exists():  # a WAL of an older file must not be replayed onto the new one; keep it aside
            os.replace(stale_wal, stale_wal.with_name(f"{stale_wal.name}.stale-{int(time.time())}"))
        os.replace(tmp, db_path)
    except BaseException:
        con.close()
        for p in (tmp, Path(str(tmp) + ".wal")):  # our own half-built temp file only
            if p.exists():
                p.unlink()
        raise
    stats["seconds"] = round(time.time() - t0, 3)
    return stats
