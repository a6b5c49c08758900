"""RunContext: the only channel from a running task to the outside world.

A task writes everything through this object: scalar metrics and curves go to `metrics.jsonl` in the run dir
(the source of truth) and, when a live sink is attached (MLflow, set up by the runner), to that sink as well;
figures go to `figures/`; progress to `progress.json`; checkpoints to `checkpoints/`.

Stdlib only at import time (torch is imported lazily for `device`), so the orchestrator can import it cheaply
and a trial can run on a bare GPU node without any of the orchestration dependencies.
"""
from __future__ import annotations

import json
import math
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol

from dpx.rundir import (CHECKPOINTS, FIGURES, METRICS, PROGRESS,
                        atomic_write_json)  # noqa: F401  (atomic_write_json re-exported: tasks write JSON through it)


LAST_CHECKPOINT = "last.pt"
"""the resumable training state in checkpoints/ (the shared loop writes it, a later attempt resumes from it)"""


class Preempted(Exception):
    """Raised by a task after it saved a checkpoint because the trial was asked to stop (SIGTERM/SIGUSR1)."""


class Diverged(Exception):
    """Raised by a task when the loss became NaN/Inf; the message names the step."""


class MetricSink(Protocol):
    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...
    def log_figure(self, path: Path) -> None: ...


class RunContext:
    """Handed to `TaskSpec.run(config, ctx)`. One per trial attempt."""

    def __init__(self, run_dir: str | Path, config: dict, attempt: int = 1,
                 sinks: Iterable[MetricSink] = (), device: str | None = None):
        self.run_dir = Path(run_dir)
        self.config = config
        self.trial_id: str = config.get("trial_id", self.run_dir.name)
        self.attempt = attempt
        self.sinks = list(sinks)
        self._device = device
        self._stop = threading.Event()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoint_dir.mkdir(exist_ok=True)
        self._metrics_f = open(self.run_dir / METRICS, "a", buffering=1)

    # ---- where things go -------------------------------------------------------------------------------
    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / CHECKPOINTS

    @property
    def figures_dir(self) -> Path:
        d = self.run_dir / FIGURES
        d.mkdir(exist_ok=True)
        return d

    @property
    def device(self):
        import torch  # torch: only a trial asks for its device; the orchestrator imports this module torch-free

        if self._device is None:
            self._device = "cuda" if torch.cuda.is_available() else "cpu"
        return torch.device(self._device)

    def resume_path(self) -> Path | None:
        """The last checkpoint of an earlier attempt of this trial, if any."""
        p = self.checkpoint_dir / LAST_CHECKPOINT
        return p if p.exists() else None

    # ---- logging ---------------------------------------------------------------------------------------
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        """Scalars at a training step. NaN/Inf are written as null (JSON has no NaN) and still reported."""
        self._write(metrics, step, "scalar")
        for s in self.sinks:
            _safe(s.log_metrics, {k: float(v) for k, v in metrics.items() if _finite(v)}, step or 0)

    def log_curve(self, key: str, xs: Iterable[float], ys: Iterable[float]) -> None:
        """A curve such as accuracy vs position: one line per point, `step` = x (an int position)."""
        xs, ys = list(xs), list(ys)
        t = time.time()
        lines = [json.dumps({"key": key, "value": _clean(y), "step": int(x), "time": t, "kind": "curve"})
                 for x, y in zip(xs, ys)]
        self._metrics_f.write("\n".join(lines) + "\n")
        for s in self.sinks:
            for x, y in zip(xs, ys):
                if _finite(y):
                    _safe(s.log_metrics, {key: float(y)}, int(x))

    def save_figure(self, fig: Any, name: str) -> Path:
        """Save a matplotlib figure as figures/<name>.png and forward it to the sinks."""
        path = self.figures_dir / (name if name.endswith(".png") else f"{name}.png")
        fig.savefig(path, dpi=110, bbox_inches="tight")
        for s in self.sinks:
            _safe(s.log_figure, path)
        return path

    def report_progress(self, fraction: float, message: str = "") -> None:
        atomic_write_json(self.run_dir / PROGRESS,
                          {"fraction": float(max(0.0, min(1.0, fraction))), "message": message, "time": time.time()})

    def _write(self, metrics: dict[str, float], step: int | None, kind: str) -> None:
        t = time.time()
        lines = [json.dumps({"key": k, "value": _clean(v), "step": step, "time": t, "kind": kind})
                 for k, v in metrics.items()]
        self._metrics_f.write("\n".join(lines) + "\n")

    # ---- preemption --------------------------------------------------------------------------------------
    def should_stop(self) -> bool:
        """True once the trial was asked to stop; the task then checkpoints and raises `Preempted`."""
        return self._stop.is_set()

    def request_stop(self) -> None:
        self._stop.set()

    def install_signal_handlers(self, signals=(signal.SIGTERM, signal.SIGUSR1)) -> None:
        for s in signals:
            signal.signal(s, lambda *_: self._stop.set())

    def close(self) -> None:
        self._metrics_f.close()


def _finite(v: Any) -> bool:
    try:
        return math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def _clean(v: Any) -> float | None:
    v = float(v)
    return v if math.isfinite(v) else None


def _safe(fn: Callable, *args: Any) -> None:
    """A live sink (MLflow) must never kill a trial: the run dir is the source of truth, `dpx sync` catches up."""
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001
        print(f"[dpx] live metric sink failed, run dir still has the data: {e}", flush=True)
