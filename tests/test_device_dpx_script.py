""".ci/device_dpx.sh (dpx on the device tool's GPU machine, whose calls are cut off at 600 s) on this machine, with
DPX_DEVICE_SETUP=0 and the venv's python3 first on PATH: the workspace tar (checkpoints left out unless
DPX_WS_CHECKPOINTS=1 (those of trials not completed) or =all; written also when the command fails), which
overrides go with submit/rerun, DPX_WS_FROM's check, and (slow) a run in two legs:
DPX_STOP_AFTER_S / SIGUSR1 cancels it mid-training and exits 75, then `DPX_WS_FROM=... rerun RECIPE --failed
--wait` on a fresh workspace resumes the cancelled trials from their checkpoints and completes them."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / ".ci" / "device_dpx.sh"
RECIPE = "recipes/fig5_state_tracking.yaml"
STEPS = 1000
# 2 trials (n_h = 1, 2) of ~1000 steps at ~40 steps/s on one CPU each: ~25 s each, a checkpoint every 20 steps;
# no early stop (val/seq_acc 0.99 would end the n_h = 2 trial after ~150 steps)
OVERRIDES = ["scale=cpu", f"train.steps={STEPS}", "train.checkpoint_every=20", "train.early_stop_value=2.0",
             "hardware.max_parallel=2"]


def _env(tmp_path: Path, **extra: str) -> dict:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "DPX_DEVICE_SETUP": "0", "PYTHONUNBUFFERED": "1", "RAY_AUTH_MODE": "disabled",
           "MLFLOW_DISABLE_TELEMETRY": "true", "DPX_WORKSPACE": str(tmp_path / "ws")}
    for k in ("OUT", "DPX_WS_FROM", "DPX_WS_CHECKPOINTS", "DPX_STOP_AFTER_S", "DPX_STOP_GRACE_S"):
        env.pop(k, None)
    env.update(extra)
    return env


def _script(*args: str, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=timeout,
                          cwd=REPO)


def _names(tgz: Path) -> list[str]:
    with tarfile.open(tgz) as t:
        return t.getnames()


def test_syntax():
    r = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("args, added", [
    (["submit", RECIPE, "scale=cpu", "--wait"], True),
    (["rerun", RECIPE, "--failed", "--wait"], False),  # none given: the last submission's (with it) are reused
    (["rerun", RECIPE, "--failed", "--max-trials", "5"], False),
    (["rerun", RECIPE, "--failed", "seeds=[1]", "--wait"], True),  # given: they replace the last ones
    (["rerun", RECIPE, "--failed", "~eval.probe"], True),
    (["status", RECIPE], False),
])
def test_tracking_off_added_to_submit_and_to_rerun_with_overrides(tmp_path, args, added):
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "python3").write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "$ARGS_OUT"\n')
    (shim / "python3").chmod(0o755)
    env = _env(tmp_path, ARGS_OUT=str(tmp_path / "args"))
    env["PATH"] = f"{shim}{os.pathsep}{env['PATH']}"
    r = _script(*args, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    got = (tmp_path / "args").read_text().splitlines()
    assert got == ["-m", "dpx.orchestrator.cli", *args] + (["tracking.enabled=false"] if added else []), got


def test_stop_after_s_cancels_stops_the_watcher_and_tars(tmp_path):
    """The time limit itself (the slow test below stops with SIGUSR1): a `--wait` that never ends is cancelled after
    DPX_STOP_AFTER_S, stopped after DPX_STOP_GRACE_S, the tar is written and the script exits 75."""
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "python3").write_text('#!/usr/bin/env bash\n[ "$3" = cancel ] && { echo "$@" >> "$ARGS_OUT"; exit 0; }\n'
                                  'exec sleep 60\n')
    (shim / "python3").chmod(0o755)
    (tmp_path / "ws").mkdir()
    out = tmp_path / "out"
    out.mkdir()
    env = _env(tmp_path, ARGS_OUT=str(tmp_path / "args"), OUT=str(out), DPX_STOP_AFTER_S="1", DPX_STOP_GRACE_S="1")
    env["PATH"] = f"{shim}{os.pathsep}{env['PATH']}"
    t0 = time.time()
    r = _script("submit", RECIPE, "scale=cpu", "--wait", env=env, timeout=30)
    assert r.returncode == 75 and time.time() - t0 < 20, r.stdout + r.stderr
    assert (tmp_path / "args").read_text().split() == ["-m", "dpx.orchestrator.cli", "cancel", RECIPE]
    assert (out / "dpx_ws.tgz").exists()
    last = r.stderr.strip().splitlines()[-1]
    assert "run stopped" in last and "no checkpoints in the tar" in last, last  # DPX_WS_CHECKPOINTS unset


def test_tar_checkpoints_optional_and_written_when_the_command_fails(tmp_path):
    ws = tmp_path / "ws"
    for t in ("done1", "open1"):  # a completed trial (result.json) and one that is not
        (ws / "runs" / "r" / t / "checkpoints").mkdir(parents=True)
        (ws / "runs" / "r" / t / "checkpoints" / "last.pt").write_text("x")
        (ws / "runs" / "r" / t / "log.txt").write_text("log")
    (ws / "runs" / "r" / "done1" / "result.json").write_text("{}")
    for flag, kept in ((None, set()), ("0", set()), ("1", {"open1"}), ("all", {"done1", "open1"})):
        out = tmp_path / f"out_{flag}"
        out.mkdir()
        extra = {"OUT": str(out)} | ({"DPX_WS_CHECKPOINTS": flag} if flag else {})
        r = _script("status", "no_such_recipe", env=_env(tmp_path, **extra))
        assert r.returncode != 0, r.stdout + r.stderr  # the command failed; the tar is still written
        names = _names(out / "dpx_ws.tgz")
        assert {"ws/runs/r/done1/log.txt", "ws/runs/r/open1/log.txt", "ws/runs/r/done1/result.json"} <= set(names)
        assert {t for t in ("done1", "open1") if f"ws/runs/r/{t}/checkpoints/last.pt" in names} == kept, (flag, names)


def test_ws_from_restores_and_checks_the_folder_name(tmp_path):
    src = tmp_path / "src"
    (src / "ws").mkdir(parents=True)
    (src / "ws" / "marker").write_text("restored")
    good, bad = tmp_path / "good.tgz", tmp_path / "bad.tgz"
    with tarfile.open(good, "w:gz") as t:
        t.add(src / "ws", arcname="ws")
    with tarfile.open(bad, "w:gz") as t:
        t.add(src / "ws", arcname="other")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "stale").write_text("old")  # replaced, not merged
    r = _script("status", env=_env(tmp_path, DPX_WS_FROM=str(good)))
    assert (ws / "marker").read_text() == "restored" and not (ws / "stale").exists(), r.stdout + r.stderr
    r = _script("status", env=_env(tmp_path, DPX_WS_FROM=str(bad)))
    assert r.returncode == 1 and "holds no folder ws/" in r.stderr, r.stdout + r.stderr
    assert (ws / "marker").exists() and not list(tmp_path.glob(".dpx_ws_from.*"))  # untouched, no leftovers


def _trials(ws: Path) -> dict[str, dict]:
    con = sqlite3.connect(ws / "state.db")
    con.row_factory = sqlite3.Row
    try:
        return {r["trial_id"]: dict(r) for r in con.execute("SELECT * FROM trials")}
    finally:
        con.close()


@pytest.mark.slow
def test_stop_then_resume_from_the_tar(tmp_path):
    ws = tmp_path / "ws"
    out1, out2 = tmp_path / "out1", tmp_path / "out2"
    out1.mkdir()
    out2.mkdir()
    env = _env(tmp_path, OUT=str(out1), DPX_WS_CHECKPOINTS="1", DPX_STOP_AFTER_S="240")
    log1 = tmp_path / "leg1.log"
    t0 = time.time()
    # leg 1: stopped (SIGUSR1, the script's own early stop) once every trial has written a checkpoint; the time limit
    # is only a backstop, so how fast this machine trains does not matter
    with open(log1, "w") as f:
        p = subprocess.Popen(["bash", str(SCRIPT), "submit", RECIPE, *OVERRIDES, "--wait"], stdout=f,
                             stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
    try:
        deadline = time.time() + 150
        while time.time() < deadline and p.poll() is None:
            if len(list(ws.glob("runs/*/*/checkpoints/last.pt"))) >= 2:
                break
            time.sleep(0.2)
        assert p.poll() is None, f"the script ended before both trials checkpointed:\n{log1.read_text()[-3000:]}"
        p.send_signal(signal.SIGUSR1)
        rc = p.wait(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            subprocess.run([sys.executable, "-m", "dpx.orchestrator.cli", "cancel", RECIPE], env=env, cwd=REPO,
                           capture_output=True, timeout=120)
    text = log1.read_text()
    assert rc == 75, text[-3000:]
    last = text.strip().splitlines()[-1]
    assert "run stopped" in last and f"DPX_WS_FROM={out1 / 'dpx_ws.tgz'}" in last, last
    assert f"rerun {RECIPE} --failed --wait" in last, last
    t = _trials(ws)
    assert sorted(x["status"] for x in t.values()) == ["cancelled", "cancelled"], (t, text[-3000:])
    names = _names(out1 / "dpx_ws.tgz")
    for tid in t:
        assert f"ws/runs/fig5_state_tracking/{tid}/checkpoints/last.pt" in names, names
    t1 = time.time() - t0

    # leg 2, as on a fresh machine: no workspace but the tar
    tgz = tmp_path / "leg1.tgz"
    (out1 / "dpx_ws.tgz").rename(tgz)
    subprocess.run(["rm", "-rf", str(ws)], check=True)
    env2 = _env(tmp_path, OUT=str(out2), DPX_WS_FROM=str(tgz), DPX_WS_CHECKPOINTS="1", DPX_STOP_AFTER_S="240")
    r = _script("rerun", RECIPE, "--failed", "--wait", env=env2, timeout=280)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "restored from" in r.stderr and "reusing the overrides" in r.stdout, r.stdout[-2000:] + r.stderr
    assert "tracking.enabled=false" in r.stdout  # reused from leg 1's submission (the script added it there)
    t = _trials(ws)
    assert sorted(x["status"] for x in t.values()) == ["completed", "completed"], t
    for tid in t:
        run = ws / "runs" / "fig5_state_tracking" / tid
        log = (run / "log.txt").read_text()
        resumed = [x for x in log.splitlines() if "resumed from" in x]
        assert len(resumed) == 1, log
        step = int(resumed[0].split(" at step ")[1].split()[0])
        assert 20 <= step < STEPS, resumed
        res = json.loads((run / "result.json").read_text())
        assert res["status"] == "completed" and res["metrics"]["train/steps"] == STEPS, res
    names = _names(out2 / "dpx_ws.tgz")  # DPX_WS_CHECKPOINTS=1: completed trials' checkpoints stay out
    assert "ws/state.db" in names and not [x for x in names if "/checkpoints/" in x], names
    print(f"leg 1 {t1:.0f} s, total {time.time() - t0:.0f} s")
