"""The Python API (`import dpx`): version, expand, submit -> handle (status, wait, cancel, results), results() as a
pandas DataFrame (recipe or SQL); tasks added by another package through the `dpx.tasks` entry point; and the
README's example script, run as a user would. Real workspace, real DuckDB, real trial processes (debug task)."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import fake_install

import dpx

REPO = Path(__file__).resolve().parents[1]

RECIPE = """
name: apidbg
task: {name: debug, steps: 2, sleep_s: 0.0}
grid: {task.value: [1.0, 2.0]}
hardware: {max_parallel: 2}
tracking: {enabled: false}
"""


def test_version_and_expand(tmp_path):
    from importlib.metadata import version

    assert dpx.__version__ == version("dpx")
    p = tmp_path / "apidbg.yaml"
    p.write_text(RECIPE)
    ex = dpx.expand(p, ["task.steps=1,2,3"])
    assert len(ex.trials) == 6 and set(ex.axes) == {"task.value", "task.steps"}
    with pytest.raises(dpx.RecipeError, match="apidbg.yaml:task.stepz: unknown key"):
        dpx.expand(p, ["task.stepz=1"])
    assert not (tmp_path / ".dpx").exists()


def test_submit_handle_and_results(tmp_path):
    ws = tmp_path / "ws"
    p = tmp_path / "apidbg.yaml"
    p.write_text(RECIPE)
    sub = dpx.submit(p, ["seeds=[0,1]"], workspace=ws)
    assert isinstance(sub, dpx.Submission) and len(sub.trial_ids) == 4
    counts = sub.wait(timeout=180)
    assert counts["completed"] == 4 and sub.done
    df = sub.results()
    assert len(df) == 4 and set(df["status"]) == {"completed"}
    assert sorted(df["score"]) == [1.0, 1.0, 2.0, 2.0]
    df2 = dpx.results("SELECT recipe, count(*) AS n FROM trials GROUP BY recipe", workspace=ws)
    assert df2.to_dict("records") == [{"recipe": "apidbg", "n": 4}]
    assert len(dpx.results("apidbg", workspace=ws)) == 4  # by name
    assert dpx.status("apidbg", workspace=ws)["apidbg"]["completed"] == 4
    again = dpx.submit("apidbg", ["seeds=[0,1]"], workspace=ws)  # by name: nothing new to run
    assert again.wait(timeout=60)["completed"] == 4
    with pytest.raises(dpx.RecipeError, match="no trials of recipe 'nope'"):
        dpx.results("nope", workspace=ws)
    with pytest.raises(dpx.RecipeError, match="query:"):
        dpx.results("SELECT * FROM no_such_table", workspace=ws)
    # cancel: a long trial, cancelled through the handle
    slow = dpx.submit(p, ["task.steps=200", "task.sleep_s=0.2", "task.value=9.0"], workspace=ws)
    slow.cancel()
    c = slow.wait(timeout=120)
    assert c["cancelled"] == 1 and c["completed"] == 0


PLUGIN = '''
plugin_task = {"config": "dpx_test_plugin.config:PlugConfig", "run": "dpx_test_plugin.run:run",
               "doc": "a task from another package", "needs_model": False}
'''
PLUGIN_CONFIG = '''
from dataclasses import dataclass


@dataclass
class PlugConfig:
    name: str = "plug"
    factor: float = 2.0
    __pydantic_config__ = {"extra": "forbid"}
'''
PLUGIN_RUN = '''
def run(config, ctx):
    ctx.log_metrics({"plug/value": config["task"]["factor"] * 3}, step=0)
    return {"score": config["task"]["factor"] * 3}
'''


def test_entry_point_task_from_another_package(tmp_path, dpx):  # the `dpx` fixture: the CLI in a subprocess
    site = fake_install(tmp_path / "site", "dpx_test_plugin",
                        {"__init__.py": PLUGIN, "config.py": PLUGIN_CONFIG, "run.py": PLUGIN_RUN},
                        "[dpx.tasks]\nplug = dpx_test_plugin:plugin_task\n")
    recipe = tmp_path / "plug.yaml"
    recipe.write_text("name: plug\ntask: {name: plug, factor: 1.5}\ngrid: {task.factor: [1.5, 2.5]}\n"
                      "tracking: {enabled: false}\n")
    env = {"PYTHONPATH": str(site)}
    r = dpx("expand", str(recipe), "--format", "ids", env=env)
    assert r.returncode == 0 and len(r.stdout.split()) == 2, r.stderr
    r = dpx("expand", str(recipe), "task.factr=1", env=env)
    assert r.returncode == 2 and "task.factr: unknown key (did you mean 'factor'?)" in r.stderr
    r = dpx("submit", str(recipe), "--wait", ws=tmp_path / "ws", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "4.5" in r.stdout and "7.5" in r.stdout


def test_readme_example_script_runs(tmp_path):
    """The script the README shows (examples/api_sweep.py) runs as is and prints its DataFrame."""
    script = REPO / "examples" / "api_sweep.py"
    assert script.name in (REPO / "README.md").read_text()
    r = subprocess.run([sys.executable, str(script), "--workspace", str(tmp_path / "ws")], capture_output=True,
                       text=True, timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "completed" in r.stdout and "score" in r.stdout
