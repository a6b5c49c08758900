"""The workspace folder (default `./.dpx`, or $DPX_WORKSPACE, or --workspace): everything dpx writes.

    .dpx/state.db        SQLite (WAL) state store, written only by the CLI and drivers
    .dpx/mlflow.db       MLflow tracking store (SQLite) and .dpx/mlruns/ its artifacts
    .dpx/results.duckdb  DuckDB tables built from run dirs (`dpx query`)
    .dpx/runs/<recipe>/<trial_id>/   run dirs, the source of truth
    .dpx/drivers/<submission>.log    driver logs
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Workspace:
    root: Path

    @classmethod
    def resolve(cls, root: str | Path | None = None) -> "Workspace":
        root = root or os.environ.get("DPX_WORKSPACE") or ".dpx"
        return cls(Path(root).expanduser().absolute())

    def create(self) -> "Workspace":
        for d in (self.root, self.runs, self.drivers):
            d.mkdir(parents=True, exist_ok=True)
        return self

    @property
    def exists(self) -> bool:
        return (self.root / "state.db").exists()

    @property
    def state_db(self) -> Path:
        return self.root / "state.db"

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    @property
    def drivers(self) -> Path:
        return self.root / "drivers"

    @property
    def duckdb(self) -> Path:
        return self.root / "results.duckdb"

    @property
    def mlflow_db(self) -> Path:
        return self.root / "mlflow.db"

    @property
    def mlflow_artifacts(self) -> Path:
        return self.root / "mlruns"

    def mlflow_uri(self, override: str | None = None) -> str:
        return override or os.environ.get("DPX_MLFLOW_URI") or f"sqlite:///{self.mlflow_db}"

    def run_dir(self, recipe: str, trial_id: str) -> Path:
        return self.runs / recipe / trial_id
