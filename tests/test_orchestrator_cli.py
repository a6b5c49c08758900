"""The CLI a Hydra/MLflow user reaches for, through the real `dpx` in subprocesses on a real workspace (debug task,
MLflow off so each submit takes seconds): recipe names everywhere, `rerun --failed` reusing the stored overrides,
one driver per recipe (a second submit hands its trials over; max_parallel holds), `watch`, `logs --follow` with
training lines, `--version`, global `-w`, `--no-wait`, validated `--format`, parquet."""
from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path

RECIPE = """
name: clidbg
task: {name: debug, steps: 3, sleep_s: 0.05}
grid: {task.value: [1.0, 2.0]}
hardware: {max_parallel: 2}
tracking: {enabled: false}
"""


def _recipe(tmp_path: Path) -> Path:
    p = tmp_path / "clidbg.yaml"
    p.write_text(RECIPE)
    return p


class PeakRunning(threading.Thread):
    """Samples the workspace's running-trial count every 50 ms until stopped; `peak` is the most seen at once."""

    def __init__(self, ws: Path):
        super().__init__(daemon=True)
        self.ws, self.peak, self.done = ws, 0, threading.Event()

    def run(self):
        while not self.done.is_set():
            try:
                con = sqlite3.connect(self.ws / "state.db", timeout=30)
                n = con.execute("SELECT count(*) FROM trials WHERE status = 'running'").fetchone()[0]
                con.close()
                self.peak = max(self.peak, n)
            except sqlite3.Error:
                pass
            time.sleep(0.05)

    def stop(self) -> int:
        self.done.set()
        self.join()
        return self.peak


def _rows(ws: Path) -> dict:
    con = sqlite3.connect(ws / "state.db")
    con.row_factory = sqlite3.Row
    try:
        return {r["trial_id"]: dict(r) for r in con.execute("SELECT * FROM trials")}
    finally:
        con.close()


def test_version_global_workspace_and_format_validation(tmp_path, dpx):
    import dpx as pkg

    r = dpx("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"dpx {pkg.__version__}" and pkg.__version__ != "0+unknown"
    p = _recipe(tmp_path)
    r = dpx("-w", str(tmp_path / "nows"), "status")  # global -w before the subcommand
    assert r.returncode == 2 and str(tmp_path / "nows") in r.stderr and not (tmp_path / "nows").exists()
    r = dpx("-w", str(tmp_path / "nows"), "repair")  # repair too reads the global -w (it read only its own once)
    assert r.returncode == 2 and str(tmp_path / "nows") in r.stderr and ".dpx" not in r.stderr
    r = dpx("expand", str(p), "--format", "parquet")  # a usage error is one line too, not click's box
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1
    assert r.stderr.startswith("error: dpx expand: Invalid value for '--format': 'parquet' is not one of")
    r = dpx("query", "SELECT 1", "--format", "xml")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "'xml' is not one of" in r.stderr
    r = dpx("expand", str(p), "task.steps=1,2", "-m", "--format", "ids")  # -m accepted, sweep crossed
    assert r.returncode == 0 and len(r.stdout.split()) == 4
    r = dpx("submit", "no_such_recipe_name", ws=tmp_path / "ws")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no_such_recipe_name" in r.stderr
    assert not (tmp_path / "ws").exists()
    r = dpx("--help")
    assert "--install-completion" in r.stdout


def test_rerun_by_name_reuses_overrides_and_results_formats(tmp_path, dpx):
    ws = tmp_path / "ws"
    p = _recipe(tmp_path)
    r = dpx("submit", str(p), "task.exit_code=1", "seeds=[1]", "--wait", cwd=tmp_path, ws=ws)
    assert r.returncode == 1, r.stdout + r.stderr  # both trials fail by design
    r = dpx("submit", str(p), "task.exit_code=1", "seeds=[1]", "--no-wait", cwd=tmp_path, ws=ws)
    assert r.returncode == 0 and "nothing to run" in r.stdout
    # by name, from another folder (the name resolves through the workspace's submissions), no overrides retyped
    r = dpx("rerun", "clidbg", "--failed", "--wait", ws=ws, cwd=Path("/"))
    assert "reusing the overrides of submission" in r.stdout and "task.exit_code=1 seeds=[1]" in r.stdout
    assert "2 failed/cancelled trial(s) of clidbg queued again" in r.stdout, r.stdout + r.stderr
    rows = _rows(ws)
    assert len(rows) == 2 and all(x["attempts"] == 2 for x in rows.values())
    # now fix them: an explicit override replaces the stored ones
    r = dpx("rerun", "clidbg", "--failed", "task.exit_code=0", "seeds=[1]", "--wait", ws=ws, cwd=Path("/"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "reusing" not in r.stdout
    # report / status / logs / cancel by name; logs shows the training lines
    tid = next(t for t, x in _rows(ws).items() if x["status"] == "completed")
    assert dpx("status", "clidbg", ws=ws).returncode == 0
    r = dpx("logs", tid[:8], ws=ws)
    assert r.returncode == 0 and "[train] step 2" in r.stdout and "[dpx] completed" in r.stdout
    r = dpx("logs", "clidbg", "--tail", "2", ws=ws)
    assert r.returncode == 0 and r.stdout.count("===== clidbg/") >= 2
    r = dpx("cancel", "clidbg", ws=ws)
    assert r.returncode == 0 and "clidbg" in r.stdout
    r = dpx("query", "SELECT trial_id, status FROM trials ORDER BY 1", "--format", "json", ws=ws)
    assert r.returncode == 0 and len(json.loads(r.stdout)) == 4
    out = tmp_path / "t.parquet"
    r = dpx("query", "SELECT trial_id, status FROM trials", "--format", "parquet", "--out", str(out), ws=ws)
    assert r.returncode == 0 and out.read_bytes()[:4] == b"PAR1"
    import pandas as pd

    assert len(pd.read_parquet(out)) == 4


def test_second_submit_hands_over_to_the_live_driver(tmp_path, dpx):
    """Two submits of one recipe while the first driver runs: one driver at a time, max_parallel (2) holds
    across both, every trial runs once, and `watch` re-attaches to the second submission's progress."""
    ws = tmp_path / "ws"
    p = _recipe(tmp_path)
    slow = ["task.sleep_s=0.4", "task.steps=4"]
    r = dpx("submit", str(p), *slow, ws=ws)
    assert r.returncode == 0, r.stderr
    sampler = PeakRunning(ws)
    sampler.start()
    r = dpx("submit", str(p), *slow, "task.value=1.0,2.0,3.0,4.0", ws=ws)
    assert r.returncode == 0 and "joined its queue" in r.stdout, r.stdout + r.stderr
    w = dpx("watch", "clidbg", ws=ws, timeout=240)
    peak = sampler.stop()
    assert w.returncode == 0, w.stdout + w.stderr
    assert "clidbg: results" in w.stdout and w.stdout.count("completed") >= 4
    assert peak <= 2
    rows = _rows(ws)
    assert len(rows) == 4 and all(x["status"] == "completed" and x["attempts"] == 1 for x in rows.values())
    for x in rows.values():  # one attempt header per log: nothing ran twice
        assert (Path(x["run_dir"]) / "log.txt").read_text().count("===== attempt") == 1
    con = sqlite3.connect(ws / "state.db")  # the logs in submission order (created_at), not by name
    subs = [r[0] for r in con.execute("SELECT id FROM submissions ORDER BY created_at")]
    con.close()
    logs = [ws / "drivers" / f"{s}.log" for s in subs]
    assert len(logs) == 2 and sorted(subs) == subs and "waiting for the live driver of clidbg" in logs[1].read_text()
    assert "every trial was run by the recipe's earlier driver" in logs[1].read_text()


def test_max_parallel_holds_across_recipes_of_a_workspace(tmp_path, dpx):
    """Two recipes, two drivers, one workspace, max_parallel 2 each: never more than 2 trials run at once in the
    workspace (the claim counts every recipe's running trials on the backend), and every trial runs once."""
    ws = tmp_path / "ws"
    paths = []
    for name, values in (("wsa", "[1.0, 2.0, 3.0]"), ("wsb", "[4.0, 5.0, 6.0]")):  # distinct configs, distinct ids
        p = tmp_path / f"{name}.yaml"
        p.write_text(RECIPE.replace("name: clidbg", f"name: {name}").replace("[1.0, 2.0]", values))
        paths.append(p)

    slow = ["task.sleep_s=0.4", "task.steps=4"]
    sampler = PeakRunning(ws)
    sampler.start()
    for p in paths:
        r = dpx("submit", str(p), *slow, ws=ws)
        assert r.returncode == 0, r.stdout + r.stderr
    for name in ("wsa", "wsb"):
        w = dpx("watch", name, ws=ws, timeout=240)
        assert w.returncode == 0 and f"{name}: results" in w.stdout, w.stdout + w.stderr
    peak = sampler.stop()
    rows = _rows(ws)
    assert len(rows) == 6 and all(x["status"] == "completed" and x["attempts"] == 1 for x in rows.values())
    assert 1 <= peak <= 2, peak


def test_logs_follow_prints_training_lines_until_the_end(tmp_path, dpx):
    ws = tmp_path / "ws"
    p = _recipe(tmp_path)
    r = dpx("submit", str(p), "task.value=1.0", "task.steps=6", "task.sleep_s=0.3", ws=ws)
    assert r.returncode == 0
    (tid,) = _rows(ws)
    deadline = time.time() + 60
    while _rows(ws)[tid]["status"] == "pending" and time.time() < deadline:
        time.sleep(0.1)
    r = dpx("logs", tid, "--follow", ws=ws, timeout=120)
    assert r.returncode == 0, r.stderr
    steps = [ln for ln in r.stdout.splitlines() if ln.startswith("[train] step")]
    assert [int(s.split()[2]) for s in steps] == list(range(6)), r.stdout
    assert "[dpx] completed" in r.stdout


def test_shell_completion_of_recipe_names(tmp_path, dpx):
    repo = Path(__file__).resolve().parents[1]
    env = {"_DPX_COMPLETE": "complete_bash", "COMP_WORDS": "dpx submit fig", "COMP_CWORD": "2"}
    r = dpx(cwd=repo, env=env, ws=tmp_path / "ws")
    assert r.returncode == 0 and "fig5_state_tracking" in r.stdout.split() and "fig12_beta01" in r.stdout.split()
    env["COMP_WORDS"] = "dpx show recipes/quick"
    r = dpx(cwd=repo, env=env, ws=tmp_path / "ws")
    assert r.stdout.split() == ["recipes/quickstart.yaml"]
    # typer detects the shell from the process tree (shellingham) unless told not to; under nohup or a reparented
    # job there is no shell to find ("Shell  not supported"), so the test names it and turns detection off
    no_detect = {"SHELL": "/bin/bash", "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    r = dpx("--show-completion", "bash", env=no_detect)
    assert r.returncode == 0 and "_dpx_completion" in r.stdout
