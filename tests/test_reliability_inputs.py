"""Bad input that once hung, crashed or was accepted (issue 16): each is now one line `error: FILE[:KEY]:
reason`, exit status 2, nothing written. In-process for the many recipe cases (the same `expand` the CLI
calls), through the real CLI for the ones that hung or tracebacked there (a FIFO, /dev/zero, `-w FILE`, a
report name that is a path) and for `submit` writing nothing."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

OK = "name: ok\ntask: {name: debug, steps: 0}\n"


def _bomb(levels: int = 9) -> str:
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for i in range(levels):
        p, c = chr(97 + i), chr(98 + i)
        lines.append(f"{c}: &{c} [" + ",".join([f"*{p}"] * 9) + "]")
    return "\n".join(lines) + "\n" + OK  # 9^10 values once unfolded


BAD = {  # name -> (recipe text, overrides, what the one line must say)
    "alias bomb": (_bomb(), [], "aliases are unfolded"),
    "100 nested lists": (OK + "eval: {extra: {x: " + "[" * 100 + "]" * 100 + "}}\n", [], "levels deep"),
    "300 nested maps": (OK + "eval: {extra: " + "{a: " * 300 + "1" + "}" * 300 + "}\n", [], "levels deep"),
    "self-merging anchor": (OK + "x: &a\n  <<: *a\n", [], "refers to itself"),
    "self-containing anchor": (OK + "eval: {extra: &a [*a]}\n", [], "refers to itself"),
    "duplicate section": (OK + "task: {name: debug, steps: 3}\n", [], "appears twice"),
    "name with a trailing newline": ('name: "x\\n"\ntask: {name: debug}\n', [], "name: must be"),
    "300-character name": ("name: " + "a" * 300 + "\ntask: {name: debug}\n", [], "100-character limit"),
    "negative seed": (OK + "seeds: [-1]\n", [], "out of range"),
    "seed 2^64": (OK + "seeds: [18446744073709551616]\n", [], "out of range"),
    "lr=nan override": (OK, ["train.lr=nan"], "train.lr: nan"),  # Hydra's grammar parses nan as a float
    "lr=inf override": (OK, ["train.lr=inf"], "NaN and infinity"),
    "lr .inf in YAML": (OK + "train: {lr: .inf}\n", [], "NaN and infinity"),
    "NaN cpus_per_trial": (OK + "hardware: {cpus_per_trial: .nan}\n", [], "hardware.cpus_per_trial"),
    "NaN timeout_min": (OK + "hardware: {timeout_min: .nan}\n", [], "hardware.timeout_min"),
    "NaN gpus_per_trial": (OK + "hardware: {gpus_per_trial: .nan}\n", [], "hardware.gpus_per_trial"),
    "NaN in a grid axis": (OK + "grid: {task.value: [1, .nan]}\n", [], "grid.task.value[1]"),
    "num_householder 1e9": ("name: m\nmodel: {family: deltaproduct}\ntask: {name: word_problem}\n",
                            ["model.num_householder=1000000000"], "limit of 64"),
    "hidden size 2^40": ("name: m\nmodel: {family: deltaproduct, hidden_size: 1099511627776}\n"
                         "task: {name: word_problem}\n", [], "limit of 65536"),
    "hidden size 2^40 in a grid": ("name: m\nmodel: {family: deltaproduct}\ntask: {name: word_problem}\n"
                                   "grid: {model.hidden_size: [64, 1099511627776]}\n", [], "grid: model.hidden_size"),
    "a trillion parameters": ("name: m\nmodel: {family: deltaproduct, hidden_size: 65536, num_layers: 1000}\n"
                              "task: {name: word_problem}\n", [], "parameters"),
    "experiment is a path": (OK + "tracking: {experiment: /tmp/elsewhere}\n", [], "tracking.experiment"),
    "experiment climbs out": (OK + "tracking: {experiment: ../../x}\n", [], "tracking.experiment"),
    "1e6-point grid": (OK + "grid: {task.value: " + str(list(range(1000))) + ", task.steps: "
                       + str(list(range(1000))) + "}\n", [], "--max-trials 1000000"),
    "2 MB recipe": (OK + "description: '" + "x" * (2 << 20) + "'\n", [], "byte"),
    # paths a recipe file names stay inside the workspace (relative to the trial's run dir, no '..')
    "checkpoint outside": ("name: lm\ntask: {name: lm, checkpoint: /etc/ckpt}\n", [], "task.checkpoint"),
    "cache_dir climbs out": ("name: w\ntask: {name: word_problem, cache_dir: ../../x}\n", [], "leaves the workspace"),
    "cache_dir under home": ("name: w\ntask: {name: word_problem, cache_dir: ~/x}\n", [], "task.cache_dir"),
    "data_dir in a grid": ("name: lm\ntask: {name: lm}\ngrid: {task.lm_eval.data_dir: [d, /data/x]}\n", [],
                           "grid.task.lm_eval.data_dir[1]"),
    "local MLflow store": (OK + "tracking: {mlflow_uri: 'sqlite:////tmp/other.db'}\n", [], "not a local store"),
    # Hydra's override grammar has no YAML anchors: the bomb is refused as unparsable, before anything unfolds
    "override alias bomb": (OK, ["eval.extra=" + _bomb().split("\n" + OK)[0].replace("\n", ", ").join("{}")],
                            "cannot parse override"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_recipe_is_one_line(tmp_path, case):
    from dpx.orchestrator.errors import RecipeError
    from dpx.orchestrator.trials import expand

    text, overrides, want = BAD[case]
    p = tmp_path / "r.yaml"
    p.write_text(text)
    t0 = time.time()
    with pytest.raises(RecipeError) as e:
        expand(p, overrides)
    line = e.value.line()
    assert "\n" not in line and line.startswith(str(p)) and want in line, line
    assert time.time() - t0 < 10, f"{case}: {time.time() - t0:.1f} s"


def test_paths_typed_on_the_command_line_pass(tmp_path):
    """The user's own paths (CLI overrides) and paths inside the workspace are accepted: relative ones and an
    MLflow server URI in the recipe, absolute ones typed as overrides (also as a sweep)."""
    from dpx.orchestrator.trials import expand

    p = tmp_path / "w.yaml"
    p.write_text("name: w\nmodel: {family: deltaproduct}\ntask: {name: word_problem, cache_dir: cache/pools}\n"
                 "tracking: {mlflow_uri: http://h:5000}\n")
    assert expand(p).trials[0].config["task"]["cache_dir"] == "cache/pools"
    t = expand(p, [f"task.cache_dir={tmp_path}/pools", "tracking.mlflow_uri=sqlite:////tmp/mine.db"]).trials
    assert t[0].config["task"]["cache_dir"] == f"{tmp_path}/pools"
    assert len(expand(p, [f"task.cache_dir={tmp_path}/a,{tmp_path}/b"]).trials) == 2


def test_grid_limit_is_raised_by_max_trials(tmp_path, dpx):
    from dpx.orchestrator import limits
    from dpx.orchestrator.errors import RecipeError
    from dpx.orchestrator.trials import expand

    p = tmp_path / "g.yaml"
    p.write_text(OK + "seeds: [0, 1]\ngrid: {task.value: " + str(list(range(60))) + "}\n")
    limits.set_max_trials(100)
    try:
        with pytest.raises(RecipeError, match="expands to 120 trials, above the limit of 100"):
            expand(p)
        limits.set_max_trials(120)
        assert len(expand(p).trials) == 120
    finally:
        limits.set_max_trials(None)
    big = tmp_path / "big.yaml"
    big.write_text(OK + "grid: {task.value: " + str(list(range(400))) + ", task.steps: " + str(list(range(300))) + "}\n")
    r = dpx("expand", str(big), "--limit", "1")
    assert r.returncode == 2 and "--max-trials 120000" in r.stderr and not r.stdout
    r = dpx("expand", str(big), "--limit", "1", "--max-trials", "120000")
    assert r.returncode == 0 and "120000 trials" in r.stdout, r.stderr


def _snapshot(root: Path) -> list:
    return sorted((str(p.relative_to(root)), p.stat().st_size if p.is_file() else -1) for p in root.rglob("*")) \
        if root.exists() else []


def test_cli_bad_input_never_hangs_or_tracebacks(tmp_path, dpx):
    """A FIFO and /dev/zero as the recipe (expand, submit and status once waited forever), `-w FILE`
    (FileExistsError), a report name that is a path (it made the folder first), a bad recipe to submit: one
    line, exit 2, nothing written."""
    ws = tmp_path / "ws"
    ok = tmp_path / "ok.yaml"
    ok.write_text(OK)
    r = dpx("submit", str(ok), "--wait", ws=ws, timeout=300)
    assert r.returncode == 0, r.stderr
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    (tmp_path / "file").write_text("x")
    before = _snapshot(ws)
    cases = [(("expand", str(fifo)), "a FIFO"), (("submit", str(fifo)), "a FIFO"), (("status", str(fifo)), "a FIFO"),
             (("expand", "/dev/zero"), "a device"), (("submit", "/dev/zero"), "a device"),
             (("status", "-w", str(tmp_path / "file")), "not a folder"),
             (("submit", str(ok), "-w", str(tmp_path / "file")), "not a folder"),
             (("report", "../../x/y"), "not a recipe name"),
             (("submit", str(ok), "train.lr=nan"), "NaN"),
             (("submit", str(ok), "--max-trials", "0"), "limit of 0")]
    for args, want in cases:
        r = dpx(*args, ws=ws, timeout=60)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and want in lines[0] and not r.stdout, (args, r.stdout, r.stderr)
    assert not (tmp_path / "x").exists() and not (ws / "reports").exists()
    assert _snapshot(ws) == before
