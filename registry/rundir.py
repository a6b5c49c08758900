"""Read one trial's run dir as data, tolerating damage: a truncated or garbled metrics.jsonl line, a missing or
unreadable result.json / error.json. Bad parts become warnings; good parts are kept. Nothing is ever written here.

metrics.jsonl itself is parsed by DuckDB's JSON reader in build.py (C++, ~50x faster than json.loads per line;
LM trials log hundreds of thousands of curve points); this module reads the small JSON files."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dpx.rundir import CONFIG_JSON, ERROR, FIGURES, METRICS, RESULT, read_json


@dataclass
class RunDirData:
    run_dir: Path
    metrics_path: Path | None = None
    result: dict | None = None
    error: dict | None = None
    config: dict | None = None
    figures: list[tuple[Path, int]] = field(default_factory=list)  # (path, bytes)
    warnings: list[str] = field(default_factory=list)


def read_run_dir(run_dir: str | Path | None, expect_result: bool) -> RunDirData:
    """Everything the registry needs from a run dir. `expect_result`: the trial claims to be completed."""
    data = RunDirData(Path(run_dir) if run_dir else Path())
    if not run_dir or not data.run_dir.is_dir():
        data.warnings.append(f"{run_dir}: run dir missing; trial kept with its state-store fields only")
        return data
    d = data.run_dir
    if (d / METRICS).is_file():
        data.metrics_path = d / METRICS
    data.result = read_json(d / RESULT, data.warnings)
    if data.result is None and expect_result and not (d / RESULT).exists():
        data.warnings.append(f"{d / RESULT}: missing for a completed trial; no summary metrics")
    data.error = read_json(d / ERROR, data.warnings)
    data.config = read_json(d / CONFIG_JSON, data.warnings)
    fig_dir = d / FIGURES
    if fig_dir.is_dir():
        for p in sorted(fig_dir.glob("*.png")):
            try:
                data.figures.append((p, p.stat().st_size))
            except OSError:  # removed while we listed it
                pass
    return data
