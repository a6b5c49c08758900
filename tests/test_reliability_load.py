"""Load: a 1,000-trial grid of short real trials (the debug task with steps: 0: a real runner process per trial,
a real run dir, result.json, MLflow child run) on the local backend completes with exactly 1,000 result rows —
in the state store, in DuckDB and in MLflow — and each trial ran once. The wall time is printed (README,
"Reliability"; BENCHMARKS.md)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_reliability_faults import attempts_in_log, drivers_done, mlflow_template, new_ws, trials, wait_for  # noqa: F401 (fixture)

N = 1000


@pytest.mark.slow
def test_thousand_trials_exactly_thousand_rows(tmp_path, dpx, mlflow_template):  # noqa: F811
    ws = new_ws(tmp_path, mlflow_template)
    recipe = tmp_path / "load.yaml"
    recipe.write_text(f"name: load\ntask: {{name: debug, steps: 0}}\ngrid: {{task.value: {list(range(N))}}}\n")
    t0 = time.time()
    r = dpx("submit", str(recipe), "--wait", ws=ws, timeout=1800)
    wall = time.time() - t0
    print(f"\n[load] {N} trials, submit --wait: {wall:.1f} s wall")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    wait_for(lambda: drivers_done(ws), 600, "the driver to close (MLflow parent run, DuckDB, figures)")
    closed = time.time() - t0
    t = trials(ws)
    # anchor for BENCHMARKS.md: the same trial as a bare runner process, started by hand, one after another
    bare = []
    for i, v in enumerate(list(t.values())[:10]):
        d = tmp_path / "bare" / str(i)
        d.mkdir(parents=True)
        shutil.copy(Path(v["run_dir"]) / "config.json", d / "config.json")
        s0 = time.time()
        subprocess.run([sys.executable, "-m", "dpx.orchestrator.trial.runner", str(d)], check=True, capture_output=True)
        bare.append(time.time() - s0)
    per = sorted(bare)[len(bare) // 2]
    print(f"[load] driver closed at {closed:.1f} s; bare runner process {per:.2f} s median; "
          f"grid {wall / N:.3f} s/trial = {wall / N / per:.2f}x one bare process (serial)")
    assert len(t) == N and all(v["status"] == "completed" and v["attempts"] == 1 for v in t.values())
    assert sum(attempts_in_log(Path(v["run_dir"])) for v in t.values()) == N  # each ran exactly once

    q = dpx("query", "SELECT count(*) AS n, count(DISTINCT trial_id) AS d, sum(CASE WHEN status = 'completed' "
            "THEN 1 ELSE 0 END) AS c FROM trials", "--format", "json", ws=ws)
    assert q.returncode == 0, q.stderr
    assert json.loads(q.stdout) == [{"n": N, "d": N, "c": N}]
    q = dpx("query", "SELECT count(*) AS n, count(DISTINCT trial_id) AS d, sum(value) AS s FROM summary "
            "WHERE key = 'score'", "--format", "json", ws=ws)
    assert q.returncode == 0, q.stderr
    assert json.loads(q.stdout) == [{"n": N, "d": N, "s": float(sum(range(N)))}]  # every score, once

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{ws / 'mlflow.db'}")
    exp = client.get_experiment_by_name("load")
    runs, token = [], None
    while True:
        page = client.search_runs([exp.experiment_id], filter_string="tags.`dpx.kind` = 'trial'",
                                  max_results=1000, page_token=token)
        runs += page
        token = page.token
        if not token:
            break
    assert len(runs) == N and len({x.data.tags["dpx.trial_id"] for x in runs}) == N
    assert all(x.info.status == "FINISHED" for x in runs)
