"""`dpx query` / `dpx compare` output: a table, CSV or JSON on stdout, or a file (`--out FILE`, also Parquet) that
dpx writes itself. The SQL never writes anything (registry/db.py: read-only, external access off), so exports come
through here: the file is written beside its final name and moved into place, it must not lie inside the
workspace (state.db, results.duckdb, run dirs are dpx's own), and its folder must exist already.

JSON is strict: NaN and ±Infinity (which `json.dumps` would print bare, and no JSON parser reads) become null.
"""
from __future__ import annotations

import csv
import decimal
import io
import json
import math
import os
from pathlib import Path
from typing import Any

from .errors import RecipeError

FORMATS = ("table", "csv", "json", "parquet")


def _clean(v: Any) -> Any:
    if isinstance(v, decimal.Decimal):  # SQL literals such as 1.5 are DECIMAL: a number, not a string
        v = float(v)
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


def to_json(cols: list[str], rows: list) -> str:
    return json.dumps([{c: _clean(v) for c, v in zip(cols, r)} for r in rows], default=str, allow_nan=False)


def to_csv(cols: list[str], rows: list) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(cols)
    w.writerows(rows)
    return buf.getvalue()


def check_out(out: str, workspace_root: Path, fmt: str) -> Path:
    """The export path, or RecipeError (one line) when it may not be written."""
    if fmt not in FORMATS or fmt == "table":
        raise RecipeError(f"--format {fmt!r} cannot be written to a file; use csv, json or parquet", "--out")
    p = Path(out).expanduser().absolute()
    real = Path(os.path.realpath(p))
    root = Path(os.path.realpath(workspace_root))
    if real == root or root in real.parents:
        raise RecipeError(f"{out}: inside the workspace {workspace_root}; exports go elsewhere", "--out")
    if real.is_dir():
        raise RecipeError(f"{out}: is a folder; name a file", "--out")
    if not real.parent.is_dir():
        raise RecipeError(f"{out}: folder {real.parent} does not exist", "--out")
    if real.exists() and not real.is_file():
        raise RecipeError(f"{out}: not a regular file", "--out")
    return real


def write_export(path: Path, fmt: str, cols: list[str] | None = None, rows: list | None = None,
                 arrow_table=None) -> int:
    """Write the rows (csv/json) or the arrow table (parquet) to path atomically; returns the rows written."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if fmt == "parquet":
            import duckdb  # duckdb: only parquet export needs it

            con = duckdb.connect(config={"autoinstall_known_extensions": False})  # in memory, our own SQL only
            try:
                con.register("export_rows", arrow_table)
                con.execute("COPY export_rows TO ? (FORMAT parquet)", [str(tmp)])
            finally:
                con.close()
            n = arrow_table.num_rows
        else:
            text = to_json(cols, rows) + "\n" if fmt == "json" else to_csv(cols, rows)
            with open(tmp, "w", encoding="utf-8", newline="") as f:
                f.write(text)
            n = len(rows)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return n
