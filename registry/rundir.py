"""Read one trial's run dir as data, tolerating damage: a truncated or garbled metrics.jsonl line, a missing or
unreadable result.json / error.json. Bad parts become warnings; good parts are kept. Nothing is ever written here.

Workers may be appending to metrics.jsonl while we read: a last line without its newline is treated as not yet
written (skipped with a warning only if it also fails to parse)."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class RunDirData:
    run_dir: Path
    scalars: list[tuple[str, float | None, float | None, float | None]] = field(default_factory=list)  # key, step, value, time
    curves: list[tuple[str, float | None, float | None]] = field(default_factory=list)  # key, x, y
    result: dict | None = None
    error: dict | None = None
    config: dict | None = None
    figures: list[Path] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    bad_lines: int = 0


def _num(v: Any) -> float | None:
    """JSON number -> float; null, NaN, strings -> None (NULL in DuckDB). Infinity stays infinite."""
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        f = float(v)
        return None if math.isnan(f) else f
    return None


def _load_json(path: Path, warnings: list[str]) -> dict | None:
    if not path.exists():
        return None
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        warnings.append(f"{path}: unreadable JSON ({type(e).__name__}: {str(e)[:80]}); ignored")
        return None
    if not isinstance(obj, dict):
        warnings.append(f"{path}: expected a JSON object, got {type(obj).__name__}; ignored")
        return None
    return obj


def read_metrics(path: Path, data: RunDirData) -> None:
    try:
        raw = path.read_bytes()
    except OSError as e:
        data.warnings.append(f"{path}: cannot read ({e.strerror}); no metrics from this trial")
        return
    lines = raw.split(b"\n")
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict) or not isinstance(rec.get("key"), str):
                raise ValueError("not an object with a string 'key'")
        except ValueError as e:
            data.bad_lines += 1
            where = "last line (truncated?)" if i == len(lines) else f"line {i}"
            data.warnings.append(f"{path}: {where} skipped: {str(e)[:60]}")
            continue
        kind = rec.get("kind", "scalar")
        if kind == "curve":
            data.curves.append((rec["key"], _num(rec.get("step")), _num(rec.get("value"))))
        else:
            data.scalars.append((rec["key"], _num(rec.get("step")), _num(rec.get("value")), _num(rec.get("time"))))


def read_run_dir(run_dir: str | Path | None, expect_result: bool) -> RunDirData:
    """Everything the registry needs from a run dir. `expect_result`: the trial claims to be completed."""
    data = RunDirData(Path(run_dir) if run_dir else Path())
    if not run_dir or not data.run_dir.is_dir():
        data.warnings.append(f"{run_dir}: run dir missing; trial kept with its state-store fields only")
        return data
    d = data.run_dir
    if (d / "metrics.jsonl").exists():
        read_metrics(d / "metrics.jsonl", data)
    data.result = _load_json(d / "result.json", data.warnings)
    if data.result is None and expect_result and not (d / "result.json").exists():
        data.warnings.append(f"{d / 'result.json'}: missing for a completed trial; no summary metrics")
    data.error = _load_json(d / "error.json", data.warnings)
    data.config = _load_json(d / "config.json", data.warnings)
    fig_dir = d / "figures"
    if fig_dir.is_dir():
        data.figures = sorted(p for p in fig_dir.glob("*.png") if p.is_file())
    return data
