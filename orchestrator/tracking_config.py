"""Recipe section `tracking:`: whether and where the driver logs to MLflow (tracking.py does the logging). Never
part of a trial's identity. A stdlib dataclass validated by pydantic, like hardware.py's."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .hardware import known_fields


@dataclass
class TrackingConfig:
    __pydantic_config__ = {"extra": "forbid"}

    enabled: bool = True
    """log to MLflow (run dirs and DuckDB are always written; `dpx sync` can log to MLflow later)"""
    mlflow_uri: Optional[str] = None
    """MLflow tracking URI (default: sqlite:///<workspace>/mlflow.db); `dpx server` prints one for clusters"""
    experiment: Optional[str] = None
    """MLflow experiment name (default: the recipe name)"""

    @classmethod
    def of(cls, config: dict) -> TrackingConfig:
        """The tracking section of a resolved trial config."""
        return cls(**known_fields(cls, config.get("tracking")))
