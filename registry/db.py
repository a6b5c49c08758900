"""Read-only SQL over the results database: `query(db_path, sql) -> (columns, rows)`.

Every connection here is read-only with DuckDB's external access off and its configuration locked: a query can
read the database's tables and views and nothing else. `COPY ... TO`, `EXPORT DATABASE`, `ATTACH`, `INSTALL`,
`LOAD`, `read_csv('...')` and friends are refused by DuckDB itself (a query once overwrote `state.db` with
`COPY (SELECT 'x') TO '.dpx/state.db'`), and `SET enable_external_access = true` cannot undo it. Exports go through
`dpx query --format csv|json|parquet --out FILE`, which dpx writes itself (orchestrator/export.py).
"""
from __future__ import annotations

import os
from pathlib import Path

import duckdb

READ_ONLY_CONFIG = {
    "enable_external_access": False,  # no file, network or extension access from SQL
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "lock_configuration": True,  # a query cannot SET any of this back
}


def connect(db_path: str | os.PathLike) -> duckdb.DuckDBPyConnection:
    """A read-only, sandboxed connection; a clear FileNotFoundError when nothing was ingested yet."""
    p = Path(db_path)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no results database yet (it is built when trials are ingested)")
    return duckdb.connect(str(p), read_only=True, config=dict(READ_ONLY_CONFIG))


def query(db_path: str | os.PathLike, sql: str, params: list | None = None) -> tuple[list[str], list[tuple]]:
    con = connect(db_path)
    try:
        cur = con.execute(sql, params or [])
        cols = [d[0] for d in cur.description] if cur.description else []
        return cols, cur.fetchall()
    finally:
        con.close()


def query_arrow(db_path: str | os.PathLike, sql: str):
    """The result as a pyarrow Table (for a Parquet export; pyarrow comes with MLflow)."""
    con = connect(db_path)
    try:
        return con.execute(sql).fetch_arrow_table()
    finally:
        con.close()
