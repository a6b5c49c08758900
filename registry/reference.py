"""The paper's reference numbers, kept as data in registry/reference/ (CSV per table, figures.json for the figures).

Every row carries `source` (section, table/figure, PDF page, and the section of the paper notes
shared/seeds/000_0e9fddefe8f58cba.txt it was read from) and `note` (corrections the notes make, settings)."""
from __future__ import annotations

import csv
import json
from functools import lru_cache
from pathlib import Path

REFERENCE_DIR = Path(__file__).with_name("reference")
# Names users pass to `dpx compare`: every paper table/figure the registry knows.
TABLES = ("table2", "table3", "table4", "table5", "fig5")
FIGURES = ("fig4", "fig5", "fig7", "fig8", "fig9", "fig12")
# baselines: seed 001's table 8-5 (every architecture) on the state-tracking groups, beside what theory expects
KNOWN = ("table2", "table3", "table4", "table5", "fig4", "fig5", "fig7", "fig8", "fig9", "fig12", "baselines")
TEXT_COLUMNS = {"size", "tokens", "model", "beta_range", "group", "source", "note"}


def _cell(col: str, v: str):
    if col in TEXT_COLUMNS:
        return v
    if v == "":
        return None
    return float(v) if any(c in v for c in ".eE") else int(v)


@lru_cache(maxsize=None)
def load_table(name: str) -> tuple[tuple[str, ...], tuple[tuple, ...]]:
    """(columns, rows) of reference/<name>.csv; numbers parsed, empty cells None (not given by the notes)."""
    with open(REFERENCE_DIR / f"{name}.csv", newline="") as f:
        reader = csv.reader(f)
        cols = tuple(next(reader))
        rows = tuple(tuple(_cell(c, v) for c, v in zip(cols, r)) for r in reader if r)
    return cols, rows


@lru_cache(maxsize=None)
def load_figures() -> dict:
    return json.loads((REFERENCE_DIR / "figures.json").read_text())


def check_name(name: str) -> str:
    """Raise ValueError naming the known tables when `name` is not one of them."""
    if name not in KNOWN:
        raise ValueError(f"unknown paper table {name!r}; known: {', '.join(KNOWN)}")
    return name
