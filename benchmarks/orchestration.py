"""Orchestration overhead: dpx vs Ray Tune on the same no-op trials, and grid expansion time.

    .venv/bin/python benchmarks/orchestration.py [--trials 200] [--skip-ray] [--grid 100000]

1. dpx: `dpx submit --wait` of a recipe with N no-op trials (the `debug` task, steps 0) on the local backend, two
   at a time, with MLflow (SQLite) logging, run dirs and state: everything a real trial pays for.
   Overhead per trial = wall time / N (the trials do nothing).
2. Ray Tune: Tuner over N no-op trials (grid_search), max_concurrent_trials=2, local Ray with 2 CPUs, in this
   same run on this same machine.
3. Expansion of a grid of `--grid` trials (load, validate, hash), without running anything.
Prints a Markdown table to paste into BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def bench_dpx(n: int, tmp: Path) -> float:
    recipe = tmp / "noop.yaml"
    recipe.write_text(f"name: noop\ntask: {{name: debug, steps: 0}}\ngrid: {{task.value: {list(map(float, range(n)))}}}\n"
                      "hardware: {max_parallel: 2}\n")
    env = {**os.environ, "DPX_WORKSPACE": str(tmp / "ws")}
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "dpx.orchestrator.cli", "submit", str(recipe), "--wait"], env=env,
                       capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"dpx run failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    import sqlite3

    done = sqlite3.connect(tmp / "ws" / "state.db").execute(
        "SELECT count(*) FROM trials WHERE status='completed'").fetchone()[0]
    assert done == n, f"{done} of {n} completed"
    return wall


def bench_ray_tune(n: int, tmp: Path) -> float:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray import tune

    def noop(config):
        return {"score": config["x"]}

    t0 = time.perf_counter()
    ray.init(address="local", num_cpus=2, include_dashboard=False, _temp_dir=str(tmp / "ray"),
             logging_level="ERROR")
    tuner = tune.Tuner(noop, param_space={"x": tune.grid_search(list(range(n)))},
                       tune_config=tune.TuneConfig(max_concurrent_trials=2),
                       run_config=tune.RunConfig(storage_path=str(tmp / "ray_results"), name="noop", verbose=0))
    results = tuner.fit()
    wall = time.perf_counter() - t0
    assert len(results) == n and not results.errors
    ray.shutdown()
    return wall


def bench_expand(n: int, tmp: Path) -> tuple[float, float, int]:
    """A grid shaped like real sweeps: axes spread over sections (task × train) and seeds; returns wall and CPU."""
    from dpx.orchestrator.trials import expand

    seeds = 10
    side = int(round((n / seeds) ** 0.5))
    recipe = tmp / "big.yaml"
    recipe.write_text(f"name: big\ntask: {{name: debug}}\n"
                      f"grid: {{task.value: {list(map(float, range(side)))}, "
                      f"train.lr: {[round(1e-4 * (i + 1), 6) for i in range(n // seeds // side)]}}}\n"
                      f"seeds: {list(range(seeds))}\n")
    expand(recipe)  # warm imports (pydantic, task config classes) so the figure is the expansion itself
    t0, c0 = time.perf_counter(), time.process_time()
    ex = expand(recipe)
    return time.perf_counter() - t0, time.process_time() - c0, len(ex.trials)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--grid", type=int, default=100_000)
    ap.add_argument("--skip-ray", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        t_exp, c_exp, n_exp = bench_expand(a.grid, tmp)
        print(f"expand {n_exp} trials: {t_exp:.2f} s wall, {c_exp:.2f} s CPU", flush=True)
        t_dpx = bench_dpx(a.trials, tmp)
        print(f"dpx {a.trials} no-op trials: {t_dpx:.1f} s ({t_dpx / a.trials:.3f} s/trial)", flush=True)
        t_ray = None if a.skip_ray else bench_ray_tune(a.trials, tmp)
        if t_ray:
            print(f"Ray Tune {a.trials} no-op trials: {t_ray:.1f} s ({t_ray / a.trials:.3f} s/trial)", flush=True)
    print()
    print(f"machine: {platform.node()} {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print("| what | wall | per trial | ratio to Ray Tune |")
    print("| --- | --- | --- | --- |")
    print(f"| dpx, {a.trials} no-op trials, 2 at a time | {t_dpx:.1f} s | {t_dpx / a.trials:.3f} s | "
          f"{t_dpx / t_ray:.2f} |" if t_ray else f"| dpx | {t_dpx:.1f} s | {t_dpx / a.trials:.3f} s | - |")
    if t_ray:
        print(f"| Ray Tune 2.60, same trials | {t_ray:.1f} s | {t_ray / a.trials:.3f} s | 1.00 |")
    print(f"| dpx expand, {n_exp} trials | {t_exp:.2f} s ({c_exp:.2f} s CPU) | {1e6 * t_exp / n_exp:.1f} µs | - |")
    print(f"load average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
