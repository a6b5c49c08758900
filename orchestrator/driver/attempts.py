"""An attempt in its run dir, as the driver sees it: the config written before the first start, the header the
backend writes into log.txt before each attempt, the result.json / error.json that end it, its log tail."""
from __future__ import annotations

from pathlib import Path

import yaml

from dpx.rundir import ATTEMPT_HEADER, CONFIG_JSON, CONFIG_YAML, ERROR, LOG, RESULT, atomic_write_json, read_json


def write_run_dir(run_dir: Path, config: dict) -> None:
    """config.json (read by the runner) and config.yaml (for people); written once, when first started."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if not (run_dir / CONFIG_JSON).exists():
        atomic_write_json(run_dir / CONFIG_JSON, config)
        (run_dir / CONFIG_YAML).write_text(yaml.safe_dump(config, sort_keys=False))


def log_tail(run_dir: Path, n: int = 3) -> str:
    try:
        lines = [ln for ln in (Path(run_dir) / LOG).read_text(errors="replace").splitlines() if ln.strip()]
        return " | ".join(lines[-n:])[-400:]
    except OSError:
        return ""


def attempt_started(run_dir: Path, attempt: int) -> bool:
    """The backend wrote this attempt's header into log.txt (it does so before it starts the process)."""
    try:
        return f"{ATTEMPT_HEADER}{attempt} " in (Path(run_dir) / LOG).read_text(errors="replace")
    except OSError:
        return False


def attempt_ended(run_dir: Path, attempt: int) -> bool:
    """The attempt wrote its result.json or error.json (the runner's last act)."""
    return any((read_json(Path(run_dir) / f) or {}).get("attempt") == attempt for f in (RESULT, ERROR))
