"""MLflow: one experiment per recipe, one parent run per submission, one child run per trial.

Only the driver and the CLI talk to MLflow; trials write their run dir. The driver forwards each trial's
metrics.jsonl to its child run while the trial runs (live, from a byte offset kept in the state store) and its
figures and summary when it ends. Why not log from the trial itself: SQLite allows one writer (many trials
writing one mlflow.db is the known "database is locked" failure), importing mlflow costs a trial about a second,
and compute nodes may not reach the store at all. `dpx sync` replays run dirs into MLflow; replays are
idempotent because every point carries the timestamp written in metrics.jsonl and MLflow drops exact duplicates.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
log = logging.getLogger("dpx.tracking")

MAX_PARAM_LEN = 6000


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}."))
    else:
        out[prefix[:-1]] = d
    return out


def trial_params(config: dict) -> dict[str, str]:
    keep = {k: config.get(k) for k in ("model", "task", "train", "eval")}
    flat = flatten(keep)
    flat["seed"], flat["version"] = config.get("seed"), config.get("version")
    return {k: json.dumps(v) if isinstance(v, (list, dict)) else str(v)[:MAX_PARAM_LEN] for k, v in flat.items()}


class Tracker:
    def __init__(self, uri: str, artifact_root: Path | None = None):
        import mlflow  # noqa: F401  (heavy: imported only by drivers and the CLI)
        from mlflow.tracking import MlflowClient

        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        self.artifact_root = artifact_root

    def experiment(self, name: str) -> str:
        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        loc = None
        if self.artifact_root is not None and self.uri.startswith("sqlite:"):
            loc = (Path(self.artifact_root) / name).absolute().as_uri()
        try:
            return self.client.create_experiment(name, artifact_location=loc)
        except Exception:  # noqa: BLE001 — created concurrently by another CLI: use theirs
            exp = self.client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id

    def parent_run(self, experiment_id: str, submission_id: str, recipe: str, file: str, n_trials: int) -> str:
        run = self.client.create_run(experiment_id, run_name=f"{recipe}/{submission_id}", tags={
            "dpx.kind": "submission", "dpx.recipe": recipe, "dpx.submission": submission_id,
            "dpx.recipe_file": file, "dpx.n_trials": str(n_trials)})
        return run.info.run_id

    def child_run(self, experiment_id: str, parent_run_id: str | None, row: dict) -> str:
        config = json.loads(row["config"]) if isinstance(row["config"], str) else row["config"]
        tags = {"dpx.kind": "trial", "dpx.recipe": row["recipe"], "dpx.trial_id": row["trial_id"],
                "dpx.run_dir": str(row["run_dir"])}
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        run = self.client.create_run(experiment_id, run_name=f"{row['trial_id']}", tags=tags)
        from mlflow.entities import Param

        params = [Param(k, v) for k, v in trial_params(config).items()]
        for i in range(0, len(params), 100):
            self.client.log_batch(run.info.run_id, params=params[i:i + 100])
        return run.info.run_id

    def forward(self, run_id: str, run_dir: Path, offset: int) -> int:
        """Send metrics.jsonl lines after `offset` (complete lines only); return the new offset."""
        from mlflow.entities import Metric

        path = Path(run_dir) / "metrics.jsonl"
        if not path.exists():
            return offset
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
        end = data.rfind(b"\n")
        if end < 0:
            return offset
        metrics = []
        for line in data[: end + 1].splitlines():
            try:
                m = json.loads(line)
            except ValueError:
                continue  # a torn line from a killed trial: skip it, keep the rest
            v = m.get("value")
            metrics.append(Metric(m["key"], float("nan") if v is None else float(v),
                                  int(float(m.get("time") or 0) * 1000), int(m.get("step") or 0)))
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(run_id, metrics=metrics[i:i + 1000])
        return offset + end + 1

    def finish(self, run_id: str, run_dir: Path, status: str, error: str | None = None) -> None:
        from mlflow.entities import Metric

        run_dir = Path(run_dir)
        res = _read_json(run_dir / "result.json")
        if res and status == "completed":
            ts = int(float(res.get("ended_at") or 0) * 1000)
            ms = [Metric(f"final/{k}", float(v), ts, 0) for k, v in (res.get("metrics") or {}).items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool)]
            if ms:
                self.client.log_batch(run_id, metrics=ms)
        if error:
            self.client.set_tag(run_id, "dpx.error", error[:5000])
        figs = run_dir / "figures"
        if figs.is_dir() and any(figs.iterdir()):
            self.client.log_artifacts(run_id, str(figs), "figures")
        for name in ("result.json", "config.yaml"):
            if (run_dir / name).exists():
                self.client.log_artifact(run_id, str(run_dir / name))
        self.client.set_terminated(run_id, {"completed": "FINISHED", "failed": "FAILED"}.get(status, "KILLED"))
        return True

    def end_parent(self, run_id: str, status: str, figures: list[Path] = ()) -> None:
        for f in figures:
            self.client.log_artifact(run_id, str(f), "figures")
        self.client.set_terminated(run_id, status)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
