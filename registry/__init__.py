"""dpx.registry: results database (DuckDB) built from run dirs, the paper's reference numbers, comparisons,
plots and the HTML report. Reads run dirs as data; imports duckdb, numpy, matplotlib and the stdlib only.

    ingest(db_path, trials) -> stats        (re)build the database from run dirs, atomically   (build.py)
    is_current(db_path) -> bool             built by this schema version? (else ingest again)
    query(db_path, sql) -> (columns, rows)  read-only SQL                                       (db.py)
    compare(db_path, name) -> Comparison    ours beside the paper's: table2..table5, fig4, fig5, fig8, fig9
    report(db_path, recipe, out_html)       one self-contained HTML file                        (htmlreport.py)
    plots.write_plots(db_path, out_dir)     PNGs (Fig. 4/5/8/9, tables) for MLflow              (plots.py)
Module names differ from the function names so that `dpx.registry.compare` is always the function.
"""
from __future__ import annotations

from importlib import import_module

from .build import ingest, is_current
from .comparison import Comparison, compare
from .db import query
from .reference import KNOWN as KNOWN_NAMES


def __getattr__(name: str):
    # matplotlib loads only when a report or plot is asked for: `import dpx.registry` stays cheap for the CLI.
    if name in ("report", "NothingToReport"):
        return getattr(import_module(".htmlreport", __name__), name)
    if name == "plots":
        return import_module(".plots", __name__)
    raise AttributeError(f"module 'dpx.registry' has no attribute {name!r}")


__all__ = ["ingest", "is_current", "query", "compare", "Comparison", "report", "NothingToReport", "plots", "KNOWN_NAMES"]
