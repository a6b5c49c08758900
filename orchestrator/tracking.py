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
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

from dpx.rundir import read_json

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")

MAX_PARAM_LEN = 6000
# The MLflow UI opens an experiment without this tag as a GenAI one (traces, "Detect Issues", an assistant); dpx
# trains models, so every experiment it makes or uses says so.
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
STALE_TAGS = ("dpx.error",)  # a new attempt or a completed trial must not keep a previous attempt's error

# how a grid axis is written in a child run's name: `n_h=2 β∈[0,2] seed=0` (the paper's notation)
AXIS_LABELS = {"model.num_householder": "n_h", "model.num_layers": "layers", "model.num_heads": "heads",
               "model.head_dim": "head_dim", "model.hidden_size": "d", "task.group": "", "task.language": "",
               "task.train_len": "train_len", "train.lr": "lr"}


def ui_url(base: str, experiment_id: str | None = None) -> str:
    """An MLflow UI address that opens in its model-training view. MLflow 3.17's UI picks GenAI or model training
    from a `workflowType` URL parameter, else from the browser's last choice (GenAI on a fresh browser), whatever
    the experiment's kind tag says; the links dpx prints carry the parameter."""
    path = f"#/experiments/{experiment_id}" if experiment_id else "#/experiments"
    return f"{base.rstrip('/')}/{path}?workflowType=machine_learning"


def run_label(point: dict | str | None, trial_id: str) -> str:
    """A trial's MLflow run name from its grid point: `n_h=2 β∈[0,2] seed=0`; the trial id when it has none."""
    if isinstance(point, str):
        try:
            point = json.loads(point)
        except ValueError:
            point = None
    if not isinstance(point, dict) or not point:
        return trial_id
    parts, seed = [], None
    for k, v in point.items():
        if k == "seed":
            seed = v
        elif k == "model.allow_neg_eigval":
            parts.append("β∈[0,2]" if v else "β∈[0,1]")
        else:
            label = AXIS_LABELS.get(k, k.rsplit(".", 1)[-1])
            val = f"{v:g}" if isinstance(v, float) else json.dumps(v) if isinstance(v, (list, dict)) else str(v)
            parts.append(f"{label}={val}" if label else val)
    if seed is not None:
        parts.append(f"seed={seed}")
    return " ".join(parts) or trial_id


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
            if exp.tags.get(EXPERIMENT_KIND[0]) != EXPERIMENT_KIND[1]:  # made by an older dpx: say what it is
                self.client.set_experiment_tag(exp.experiment_id, *EXPERIMENT_KIND)
            return exp.experiment_id
        loc = None
        if self.artifact_root is not None and self.uri.startswith("sqlite:"):
            loc = (Path(self.artifact_root) / name).absolute().as_uri()
        try:
            return self.client.create_experiment(name, artifact_location=loc, tags=dict([EXPERIMENT_KIND]))
        except Exception:  # noqa: BLE001 — created concurrently by another CLI: use theirs
            exp = self.client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id

    def describe(self, experiment_id: str, file: str | None) -> None:
        """The recipe's `description:` (and its file) as the experiment's description (MLflow's note)."""
        if not file:
            return
        try:
            from .load import read_recipe

            desc = str(read_recipe(file).get("description") or "").strip()
        except Exception:  # noqa: BLE001 — the file moved or broke since the submission: keep the old note
            return
        text = (desc + "\n\n" if desc else "") + f"Recipe: `{file}` (dpx)"
        exp = self.client.get_experiment(experiment_id)
        if exp.tags.get("mlflow.note.content") != text:
            self.client.set_experiment_tag(experiment_id, "mlflow.note.content", text)

    def parent_run(self, experiment_id: str, submission_id: str, recipe: str, file: str, n_trials: int) -> str:
        try:
            self.describe(experiment_id, file)
        except Exception as e:  # noqa: BLE001 — a description is a nicety
            print(f"[driver] MLflow experiment description not set: {e}", flush=True)
        run = self.client.create_run(experiment_id, run_name=f"{recipe}/{submission_id}", tags={
            "dpx.kind": "submission", "dpx.recipe": recipe, "dpx.submission": submission_id,
            "dpx.recipe_file": file, "dpx.n_trials": str(n_trials)})
        return run.info.run_id

    def restart(self, run_id: str, parent_run_id: str | None) -> None:
        """A new attempt (retry, rerun, requeue) continues the trial's run: RUNNING again, under the parent run of
        the submission that runs it now, without the previous attempt's error."""
        self.client.update_run(run_id, "RUNNING")
        if parent_run_id:
            self.client.set_tag(run_id, "mlflow.parentRunId", parent_run_id)
        self.client.set_tag(run_id, "dpx.status", "running")
        self._clear(run_id, STALE_TAGS)

    def _clear(self, run_id: str, keys) -> None:
        tags = self.client.get_run(run_id).data.tags
        for k in keys:
            if k in tags:
                self.client.delete_tag(run_id, k)

    def sync_trial(self, experiment_id: str, parent_run_id: str | None, row: dict, final: bool,
                   find_existing: bool = False) -> tuple[str, int]:
        """Bring a trial's child run up to date with its run dir in as few store calls as possible (a short trial
        costs three: create, one batch of params + metrics + tags, terminate). Returns (run_id, new offset).

        `row` is the trial's state row (recipe, trial_id, config, run_dir, status, error, mlflow_run_id,
        mlflow_offset, started_at, ended_at)."""
        from mlflow.entities import Metric, Param, RunTag

        run_dir = Path(row["run_dir"])
        run_id, offset = row.get("mlflow_run_id"), int(row.get("mlflow_offset") or 0)
        params: list = []
        if not run_id and find_existing:  # a driver killed between create_run and recording the id: reuse that run
            found = self.client.search_runs([experiment_id], max_results=1, order_by=["attributes.start_time ASC"],
                                            filter_string=f"tags.`dpx.trial_id` = '{row['trial_id']}'")
            if found:  # offset 0: replay the whole metrics.jsonl; MLflow drops the exact duplicate points
                run_id, offset = found[0].info.run_id, 0
                config = json.loads(row["config"]) if isinstance(row["config"], str) else row["config"]
                params = [Param(k, v) for k, v in trial_params(config).items()]  # the same values: accepted again
        created = not run_id  # else: a run from an earlier attempt or a killed driver
        if not run_id:
            tags = {"dpx.kind": "trial", "dpx.recipe": row["recipe"], "dpx.trial_id": row["trial_id"],
                    "dpx.run_dir": str(run_dir)}
            if parent_run_id:
                tags["mlflow.parentRunId"] = parent_run_id
            start = int(1000 * (row.get("started_at") or 0)) or None
            run_id = self.client.create_run(experiment_id, start_time=start,
                                            run_name=run_label(row.get("point"), row["trial_id"]),
                                            tags=tags).info.run_id
            config = json.loads(row["config"]) if isinstance(row["config"], str) else row["config"]
            params = [Param(k, v) for k, v in trial_params(config).items()]
        metrics, offset = read_metrics(run_dir, offset)
        tags_: list = []
        if final:
            res = read_json(run_dir / "result.json")
            if res and row["status"] == "completed":
                ts = int(float(res.get("ended_at") or 0) * 1000)
                metrics += [Metric(f"final/{k}", float(v), ts, 0) for k, v in (res.get("metrics") or {}).items()
                            if isinstance(v, (int, float)) and not isinstance(v, bool)]
            if row.get("error") and row["status"] != "completed":
                tags_.append(RunTag("dpx.error", str(row["error"])[:5000]))
            elif not created:
                self._clear(run_id, STALE_TAGS)  # e.g. `cancelled by user` of an attempt a rerun completed
            tags_.append(RunTag("dpx.status", row["status"]))
        while params or metrics or tags_:  # MLflow takes ≤100 params and ≤1000 entries per batch
            p, params = params[:100], params[100:]
            m, metrics = metrics[:1000 - len(p)], metrics[1000 - len(p):]
            t, tags_ = tags_[:100], tags_[100:]
            self.client.log_batch(run_id, metrics=m, params=p, tags=t)
        if final:
            figs = run_dir / "figures"
            if figs.is_dir() and any(figs.iterdir()):
                self.client.log_artifacts(run_id, str(figs), "figures")
            end = int(1000 * (row.get("ended_at") or 0)) or None
            self.client.set_terminated(run_id, {"completed": "FINISHED", "failed": "FAILED"}.get(row["status"], "KILLED"),
                                       end_time=end)
        return run_id, offset

    def end_parent(self, run_id: str, status: str, figures: list[Path] = ()) -> None:
        for f in figures:
            self.client.log_artifact(run_id, str(f), "figures")
        self.client.set_terminated(run_id, status)


def read_metrics(run_dir: Path, offset: int) -> tuple[list, int]:
    """Metrics of metrics.jsonl after byte `offset`, complete lines only; returns (metrics, new offset)."""
    from mlflow.entities import Metric

    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return [], offset
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n")
    if end < 0:
        return [], offset
    out = []
    for line in data[: end + 1].splitlines():
        try:
            m = json.loads(line)
            v = m.get("value")
            out.append(Metric(m["key"], float("nan") if v is None else float(v),
                              int(float(m.get("time") or 0) * 1000), int(m.get("step") or 0)))
        except (ValueError, KeyError, TypeError):
            continue  # a torn line from a killed trial: skip it, keep the rest
    return out, offset + end + 1


class Forwarder(threading.Thread):
    """The driver's MLflow thread: trials are scheduled while their MLflow bookkeeping catches up behind them.

    Events: ("progress", trial_id) for a running trial (live curves), ("restart", trial_id) when a new attempt
    starts, ("final", trial_id) once it ended. The
    thread has its own state-store connection and records run id, byte offset and completion per trial, so a
    crash anywhere resumes from the last recorded offset (and MLflow drops exact duplicate points)."""

    def __init__(self, tracker: Tracker, state_path: Path, recipe: str, experiment_id: str, parent_run_id: str):
        super().__init__(daemon=True, name="dpx-mlflow")
        from .state import StateStore

        self.tracker, self.recipe = tracker, recipe
        self.exp_id, self.parent_id = experiment_id, parent_run_id
        self.store = StateStore(state_path)
        self.t0 = time.time()
        self.q: "queue.Queue[tuple[str, str] | None]" = queue.Queue()
        self.failures = 0

    def run(self) -> None:
        while True:
            item = self.q.get()
            if item is None:
                return
            kind, tid = item
            rows = self.store.q("SELECT * FROM trials WHERE recipe = ? AND trial_id = ?", (self.recipe, tid))
            if not rows:
                continue
            row = dict(rows[0])
            if kind == "restart":  # a new attempt continues the trial's MLflow run, under this driver's parent
                if row["mlflow_run_id"]:
                    try:
                        self.tracker.restart(row["mlflow_run_id"], self.parent_id)
                    except Exception as e:  # noqa: BLE001
                        print(f"[driver] MLflow update of {tid} failed: {e}", flush=True)
                continue
            final = kind == "final" and row["status"] in ("completed", "failed", "cancelled")
            try:
                # a trial started before this driver (adopted) or retried may have a run from a killed driver
                old = (row["started_at"] or 0) < self.t0 or (row["attempts"] or 0) > 1
                run_id, off = self.tracker.sync_trial(self.exp_id, self.parent_id, row, final, find_existing=old)
            except Exception as e:  # noqa: BLE001 — never fatal: `dpx sync` catches up from the run dir
                self.failures += 1
                print(f"[driver] MLflow update of {tid} failed (dpx sync will retry): {e}", flush=True)
                continue
            self.store.set_trial(self.recipe, tid, mlflow_run_id=run_id, mlflow_offset=off,
                                 **({"mlflow_done": 1} if final else {}))

    def put(self, kind: str, trial_id: str) -> None:
        self.q.put((kind, trial_id))

    def close(self, timeout: float = 600) -> None:
        self.q.put(None)
        self.join(timeout)


def mlflow_lock(root: Path):
    """An exclusive file lock around MLflow store set-up: two drivers creating a fresh SQLite schema at once is
    a known MLflow failure."""
    import fcntl

    f = open(Path(root) / ".mlflow.lock", "w")
    fcntl.flock(f, fcntl.LOCK_EX)
    return f


def enable_wal(uri: str) -> None:
    """Switch a SQLite MLflow store to WAL (persistent in the file): ~40% cheaper commits, readers don't block."""
    if not uri.startswith("sqlite:///"):
        return
    import sqlite3

    try:
        con = sqlite3.connect(uri[len("sqlite:///"):], timeout=60)
        con.execute("PRAGMA journal_mode=WAL")
        con.close()
    except sqlite3.Error:
        pass
