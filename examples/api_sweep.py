"""dpx from Python: expand a sweep, submit it, wait, and read the results as a pandas DataFrame.

    python examples/api_sweep.py [--workspace DIR]

Uses the orchestration self-test task (`debug`: no model, a few seconds); swap in any recipe of recipes/ and its
overrides, e.g. dpx.submit("recipes/quickstart.yaml", ["model.num_householder=1,2", "seeds=range(2)"]).
"""
import argparse
import tempfile
from pathlib import Path

import dpx

ap = argparse.ArgumentParser()
ap.add_argument("--workspace", default=None, help="workspace folder (default: a fresh temporary one)")
args = ap.parse_args()
ws = args.workspace or tempfile.mkdtemp(prefix="dpx-example-")

recipe = Path(ws) / "sweep.yaml"
recipe.parent.mkdir(parents=True, exist_ok=True)
recipe.write_text("name: api_sweep\ntask: {name: debug, steps: 3}\ntracking: {enabled: false}\n")

print("dpx", dpx.__version__)
ex = dpx.expand(recipe, ["task.value=1.0,2.0,3.0", "seeds=range(2)"])  # Hydra sweep syntax: 6 trials
print(f"{len(ex.trials)} trials varying {ex.axes}")

sub = dpx.submit(recipe, ["task.value=1.0,2.0,3.0", "seeds=range(2)"], workspace=ws)
print(sub.wait(timeout=600))  # {'pending': 0, 'running': 0, 'completed': 6, 'failed': 0, 'cancelled': 0}

df = sub.results()  # one row per trial: identity, the config columns that vary, summary metrics
print(df[["trial_id", "seed", "task__value", "status", "score"]].sort_values(["task__value", "seed"]))
print(df.groupby("task__value")["score"].agg(["mean", "std"]))

print(dpx.results("SELECT key, count(*) AS points FROM metrics GROUP BY key", workspace=ws))
