"""A workspace as a finished grid leaves it, made without running the trials: the real recipe expansion, the real
state store (StateStore.add_submission), and run dirs written as the driver and runner write them (config.json,
metrics.jsonl, result.json), trials marked completed. Load tests of the query path use it at 5,000 and 50,000
trials, where running every trial would take hours on this machine."""
from __future__ import annotations

import json
import time
from pathlib import Path


def make_finished_ws(ws: Path, recipe_file: Path, overrides: list[str] | None = None, score=lambda i, t: float(i),
                     extra_result=None) -> list:
    from dpx.orchestrator.state import StateStore
    from dpx.orchestrator.trials import expand
    from dpx.orchestrator.workspace import Workspace

    w = Workspace.resolve(ws).create()
    ex = expand(recipe_file, overrides or [])
    store = StateStore(w.state_db)
    sub = f"synthetic-{time.time_ns()}"
    store.add_submission(sub, ex.recipe, str(recipe_file), [], "local", ex.trials,
                         lambda t: w.run_dir(ex.recipe, t.trial_id))
    now = time.time()
    for i, t in enumerate(ex.trials):
        d = w.run_dir(ex.recipe, t.trial_id)
        d.mkdir(parents=True)  # the driver's and runner's files, without their fsyncs (setup speed)
        (d / "config.json").write_text(json.dumps(t.config))
        s = score(i, t)
        with open(d / "metrics.jsonl", "w") as f:
            f.write(json.dumps({"key": "score", "value": s, "step": 0, "time": now, "kind": "scalar"}) + "\n")
        metrics = {"score": s, **((extra_result or {}).get(i, {}) if extra_result else {})}
        (d / "result.json").write_text(json.dumps({"trial_id": t.trial_id, "status": "completed", "metrics": metrics,
                                              "attempt": 1, "started_at": now, "ended_at": now + 1,
                                               "host": "synthetic", "device": "cpu"}))
    with store.tx() as c:
        c.execute("UPDATE trials SET status = 'completed', attempts = 1, started_at = ?, ended_at = ?, "
                  "mlflow_done = 1, updated_at = ? WHERE recipe = ?", (now, now + 1, now, ex.recipe))
        c.execute("UPDATE submissions SET state = 'done', ended_at = ? WHERE id = ?", (now, sub))
    store.close()
    return ex.trials
