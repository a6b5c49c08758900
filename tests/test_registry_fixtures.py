"""Helpers for the registry tests: run dirs written by the real writers (RunContext for metrics.jsonl, curves and
figures; atomic_write_json for result.json/error.json, as the runner does), plus a check of those helpers."""
from __future__ import annotations

import json
import time
from pathlib import Path

from dpx.rundir import atomic_write_json
from dpx.tasks.context import RunContext


def make_trial(root: Path, recipe: str, tid: str, model: dict | None = None, task: dict | None = None,
               summary: dict | None = None, scalars: dict[int, dict] | None = None,
               curves: dict[str, tuple[list, list]] | None = None, status: str = "completed",
               figure: bool = False, error: str | None = None, seed: int = 0, train: dict | None = None) -> dict:
    """Write runs/<recipe>/<tid>/ the way a trial does and return the orchestrator's trial dict for it."""
    run_dir = root / recipe / tid
    config = {"recipe": recipe, "version": 1, "seed": seed, "model": model or {}, "task": task or {"name": "debug"},
              "train": train or {"lr": 1e-3, "betas": [0.9, 0.95]}, "eval": {}, "hardware": {"backend": "local"}}
    ctx = RunContext(run_dir, {**config, "trial_id": tid})
    atomic_write_json(run_dir / "config.json", {**config, "trial_id": tid})
    for step, m in (scalars or {}).items():
        ctx.log_metrics(m, step=step)
    for key, (xs, ys) in (curves or {}).items():
        ctx.log_curve(key, xs, ys)
    if figure:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(2, 2))
        ax.plot([0, 1], [1, 0])
        ctx.save_figure(fig, "loss_curve")
        plt.close(fig)
    ctx.close()
    now = time.time()
    if status == "completed":
        atomic_write_json(run_dir / "result.json", {"trial_id": tid, "status": "completed", "metrics": summary or {},
                                                    "attempt": 1, "started_at": now - 5, "ended_at": now,
                                                    "host": "testhost", "device": "cpu"})
    elif status == "failed":
        atomic_write_json(run_dir / "error.json", {"trial_id": tid, "status": "failed", "error": error or "boom",
                                                   "traceback": "Traceback ...", "attempt": 1})
    return {"trial_id": tid, "recipe": recipe, "status": status, "attempts": 1, "run_dir": str(run_dir),
            "config": config, "submitted_at": now - 10, "started_at": now - 5 if status != "pending" else None,
            "ended_at": now if status in ("completed", "failed") else None, "host": None,
            "mlflow_run_id": f"run-{tid}", "error": None}


def dp(n_h: int, layers: int = 1, neg: bool = True, **kw) -> dict:
    """A DeltaProduct model section as models/config.py spells it."""
    fam = "deltaproduct" if n_h > 1 else "deltanet"
    return {"family": fam, "num_householder": n_h, "num_layers": layers, "allow_neg_eigval": neg, **kw}


def test_make_trial_writes_the_run_dir_format(tmp_path):
    t = make_trial(tmp_path, "r", "t1", dp(2), summary={"x": 1.5}, scalars={0: {"loss": 2.0}},
                   curves={"acc_at_pos": ([1, 2], [1.0, 0.5])}, figure=True)
    d = Path(t["run_dir"])
    lines = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert [(x["key"], x["kind"]) for x in lines] == [("loss", "scalar"), ("acc_at_pos", "curve"),
                                                      ("acc_at_pos", "curve")]
    assert json.loads((d / "result.json").read_text())["metrics"] == {"x": 1.5}
    assert (d / "figures" / "loss_curve.png").stat().st_size > 100
