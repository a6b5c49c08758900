"""Read-only SQL over the results database: `query(db_path, sql) -> (columns, rows)`."""
from __future__ import annotations

import os
from pathlib import Path

import duckdb


def connect(db_path: str | os.PathLike) -> duckdb.DuckDBPyConnection:
    """A read-only connection; a clear FileNotFoundError when nothing was ingested yet."""
    p = Path(db_path)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no results database yet (it is built when trials are ingested)")
    return duckdb.connect(str(p), read_only=True, config={"autoinstall_known_extensions": False})


def query(db_path: str | os.PathLike, sql: str, params: list | None = None) -> tuple[list[str], list[tuple]]:
    con = connect(db_path)
    try:
        cur = con.execute(sql, params or [])
        cols = [d[0] for d in cur.description] if cur.description else []
        return cols, cur.fetchall()
    finally:
        con.close()
