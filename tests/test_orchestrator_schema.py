"""Bad recipes: one line naming the file, the key path and the reason; exit status 2; nothing written."""
from __future__ import annotations

import pytest

from dpx.orchestrator.errors import RecipeError
from dpx.orchestrator.trials import expand

CASES = [
    ("name: r\ntask: {name: debug, stpes: 3}\n", "task.stpes: unknown key (did you mean 'steps'?)"),
    ("name: r\ntask: {name: debug, steps: many}\n", "task.steps: Input should be a valid integer"),
    ("name: r\ntask: {name: debgu}\n", "task.name: unknown task 'debgu' (did you mean 'debug'?)"),
    ("name: r\ntask: {steps: 1}\n", "task.name: missing"),
    ("name: r\ntask: {name: debug, steps: -1}\n", "task.steps: must be >= 0"),
    ("name: r\ntask: {name: debug}\ngird: {}\n", "gird: unknown section (did you mean 'grid'?)"),
    ("name: r\ntask: {name: debug}\ngrid: {zip: {task.steps: [1, 2], task.value: [1.0]}}\n",
     "grid.zip: zip axes differ in length (task.steps=2, task.value=1)"),
    ("name: r\ntask: {name: debug}\ngrid: {task.steps: []}\n", "grid: grid block has an empty axis"),
    ("name: r\ntask: {name: debug}\ngrid: {task.steps: [1, x]}\n", "task.steps: Input should be a valid integer"),
    ("name: r\ntask: {name: debug}\nhardware: {backend: slurmm}\n", "hardware.backend: Input should be"),
    ("name: r\ntask: {name: debug}\nhardware: {gpus: 1}\n", "hardware.gpus: unknown key"),
    ("name: r\ntask: {name: debug}\nhardware: {slurm: {partiton: x}}\n",
     "hardware.slurm.partiton: unknown key (did you mean 'partition'?)"),
    ("name: r\ntask: {name: debug}\ntrain: {steps: 0}\n", "train.steps: must be >= 1"),
    ("name: r\ntask: {name: debug}\nseeds: []\n", "seeds: must list at least one seed"),
    ("name: 'a b'\ntask: {name: debug}\n", "name: must be letters"),
    ("name: r\ntask: {name: debug, steps: '${nope}'}\n", "cannot resolve"),
    ("- just\n- a list\n", "a recipe is a mapping of sections"),
    ("name: r\ntask: {name: debug\n", "invalid YAML"),
]


@pytest.mark.parametrize("body, expected", CASES)
def test_recipe_errors_name_key_and_reason(tmp_path, body, expected):
    p = tmp_path / "bad.yaml"
    p.write_text(body)
    with pytest.raises(RecipeError) as e:
        expand(p)
    line = e.value.line()
    assert line.startswith(str(p)), line
    assert expected in line, line
    assert "\n" not in line


def test_task_checks_the_model_section(tmp_path):
    p = tmp_path / "v.yaml"
    p.write_text("name: v\nmodel: {family: deltaproduct, vocab_size: 5, hidden_size: 32, num_heads: 2, head_dim: 16}\n"
                 "task: {name: word_problem, group: S3}\n")
    with pytest.raises(RecipeError, match=r"v.yaml:model.vocab_size: 5 cannot hold the S3 word problem"):
        expand(p)


def test_override_errors(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("name: r\ntask: {name: debug}\n")
    with pytest.raises(RecipeError, match="override 'oops' is not key=value"):
        expand(p, ["oops"])
    with pytest.raises(RecipeError, match="unknown section 'tsak'"):
        expand(p, ["tsak.steps=3"])
    with pytest.raises(RecipeError, match="task.stpes: unknown key"):
        expand(p, ["task.stpes=3"])


def _snapshot(root):
    if not root.exists():
        return None
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("cmd", ["expand", "submit"])
def test_cli_exit_2_one_line_nothing_written(tmp_path, dpx, cmd):
    ws = tmp_path / "ws"
    # a workspace with prior state must stay byte-for-byte unchanged
    good = tmp_path / "good.yaml"
    good.write_text("name: good\ntask: {name: debug, steps: 0}\n")
    if cmd == "submit":
        r = dpx("submit", str(good), "--wait", ws=ws)
        assert r.returncode == 0, r.stderr + r.stdout
    before = _snapshot(ws)
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ntask: {name: debug, stpes: 3}\n")
    r = dpx(cmd, str(bad), ws=ws)
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "task.stpes: unknown key (did you mean 'steps'?)" in lines[0], r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert _snapshot(ws) == before
    r = dpx(cmd, str(tmp_path / "missing.yaml"), ws=ws)
    assert r.returncode == 2 and "missing.yaml: no such recipe file" in r.stderr
