"""Recipe section `tracking:`: whether and where the driver logs to MLflow (tracking.py does the logging). Never
part of a trial's identity."""
from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict


class TrackingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    """log to MLflow (run dirs and DuckDB are always written; `dpx sync` can log to MLflow later)"""
    mlflow_uri: Optional[str] = None
    """MLflow tracking URI (default: sqlite:///<workspace>/mlflow.db); `dpx server` prints one for clusters"""
    experiment: Optional[str] = None
    """MLflow experiment name (default: the recipe name)"""
