"""Fig. 4 in the registry from real throughput trials: the recipe's (seq_len x batch) zip reaches the fig4 view
and plot as the task ran it (the batch lives in task.batch_size; every resolved trial also carries an unused
train.batch_size), ratios to n_h = 1 stay within one implementation, and dpx and fla rows are not averaged
together. The dpx trials run for real on the CPU (fig4's cpu scale, one step); fla cannot run here, so its one
row is a run dir written by hand with a made-up tokens/s."""
from __future__ import annotations

import copy
import time
from pathlib import Path

import pytest

pytest.importorskip("omegaconf")
pytest.importorskip("duckdb")
from dpx.orchestrator.trials import expand  # noqa: E402
from dpx.registry import ingest, keys, plots, query  # noqa: E402
from dpx.tasks import TASKS  # noqa: E402
from dpx.rundir import atomic_write_json
from dpx.tasks.context import RunContext  # noqa: E402

RECIPES = Path(__file__).resolve().parent.parent / "recipes"


def _run_trial(root: Path, cfg: dict, summary: dict | None = None) -> dict:
    """Run the trial's task in its run dir (or take `summary`) and write result.json as the runner does."""
    run_dir = root / cfg["recipe"] / cfg["trial_id"]
    ctx = RunContext(run_dir, cfg, device="cpu")
    atomic_write_json(run_dir / "config.json", cfg)
    try:
        metrics = summary if summary is not None else TASKS[cfg["task"]["name"]].run_fn()(cfg, ctx)
    finally:
        ctx.close()
    now = time.time()
    atomic_write_json(run_dir / "result.json", {"trial_id": cfg["trial_id"], "status": "completed",
                                                "metrics": metrics, "attempt": 1, "started_at": now - 1,
                                                "ended_at": now, "host": "testhost", "device": "cpu"})
    return {"trial_id": cfg["trial_id"], "recipe": cfg["recipe"], "status": "completed", "attempts": 1,
            "run_dir": str(run_dir), "config": cfg, "submitted_at": now - 2, "started_at": now - 1, "ended_at": now}


def test_fig4_view_has_the_recipe_shapes_ratios_and_impls(tmp_path):
    e = expand(RECIPES / "fig4_throughput.yaml", ["scale=cpu", "task.steps=1", "task.warmup_steps=0"])
    cfgs = [t.config for t in e.trials]
    shapes = {(c["task"]["seq_len"], c["task"]["batch_size"]) for c in cfgs}
    assert shapes == {(64, 8), (128, 4)} and all(c["train"]["batch_size"] == 32 for c in cfgs)  # the trap
    trials = [_run_trial(tmp_path, c) for c in cfgs]
    tps = {(c["model"]["num_householder"], c["task"]["seq_len"]): _summary(tmp_path, c)["tokens_per_s"]
           for c in cfgs}
    # fla's layer at one of the shapes (cannot run on the CPU): a hand-written run dir
    fla = copy.deepcopy(next(c for c in cfgs if c["model"]["num_householder"] == 2 and c["task"]["seq_len"] == 64))
    fla["task"]["impl"], fla["trial_id"] = "fla", "fla0000000001"
    fla_tps = 3.0 * tps[(2, 64)]
    trials.append(_run_trial(tmp_path, fla, {"tokens_per_s": fla_tps, "num_params": 1.0}))
    db = tmp_path / "r.duckdb"
    ingest(db, trials)

    cols, rows = query(db, "SELECT * FROM fig4")
    got = [dict(zip(cols, r)) for r in rows]
    dpx = {(r["n_h"], r["seq_len"], r["batch_size"]): r for r in got if r["impl"] == "dpx"}
    assert set(dpx) == {(n, 64, 8) for n in (1, 2)} | {(n, 128, 4) for n in (1, 2)}
    for (n, T, B), r in dpx.items():
        assert r["tokens_per_batch"] == 512 and r["n_runs"] == 1
        assert r["tokens_per_s"] == pytest.approx(tps[(n, T)])  # not averaged with the fla row
        assert r["ratio_to_n_h1"] == pytest.approx(tps[(n, T)] / tps[(1, T)])
    assert dpx[(2, 64, 8)]["dpx_over_fla"] == pytest.approx(1 / 3)
    assert dpx[(2, 128, 4)]["dpx_over_fla"] is None and dpx[(1, 64, 8)]["dpx_over_fla"] is None
    (f,) = [r for r in got if r["impl"] == "fla"]
    assert (f["n_h"], f["seq_len"], f["batch_size"], f["tokens_per_s"]) == (2, 64, 8, pytest.approx(fla_tps))
    assert f["ratio_to_n_h1"] is None  # no fla n_h = 1 row: never a ratio across implementations
    _, tr = query(db, "SELECT trial_id, batch_size, impl FROM trials ORDER BY trial_id")
    assert {r[0]: (r[1], r[2]) for r in tr}["fla0000000001"] == (8, "fla")
    png = plots.fig4(db, tmp_path / "fig4.png")
    assert png is not None and png.stat().st_size > 1000


def _summary(root: Path, cfg: dict) -> dict:
    import json
    return json.loads((root / cfg["recipe"] / cfg["trial_id"] / "result.json").read_text())["metrics"]


def test_batch_size_identity_per_task():
    """throughput: task.batch_size; lm: tokens_per_step / context_len (train.batch_size is overwritten by the
    task); word problems: train.batch_size."""
    lm = expand(RECIPES / "table3.yaml", ["scale=cpu"]).trials[0].config
    assert keys.identity(lm, "table3")["batch_size"] == 512 // 64
    fig4 = expand(RECIPES / "fig4_throughput.yaml", ["scale=cpu"]).trials[0].config
    ident = keys.identity(fig4, "fig4_throughput")
    assert (ident["seq_len"], ident["batch_size"], ident["impl"]) == (fig4["task"]["seq_len"],
                                                                      fig4["task"]["batch_size"], "dpx")
    wp = expand(RECIPES / "quickstart.yaml").trials[0].config
    assert keys.identity(wp, "quickstart")["batch_size"] == wp["train"]["batch_size"]
    assert keys.identity(wp, "quickstart")["impl"] is None
