"""Trial identity: stable (golden values), blind to hardware/tracking/name, sensitive to what changes results."""
from __future__ import annotations

from dpx.orchestrator.identity import trial_id
from dpx.orchestrator.trials import expand

CONF = {"version": 1, "seed": 0, "model": None,
        "task": {"name": "debug", "steps": 3, "sleep_s": 0.0, "value": 1.0, "fail": False, "exit_code": 0,
                 "nan_at_step": -1, "fail_on_attempts": 0, "checkpoint": False},
        "train": {"steps": 10, "lr": 0.001}, "eval": {}}

# Golden ids: if one of these changes, every user's finished trials would silently run again. Change only with
# a new ID_SCHEME, on purpose.
GOLDEN = "e90316605257"


def test_golden_id():
    assert trial_id(CONF) == GOLDEN


def test_id_ignores_hardware_and_tracking_and_order():
    a = dict(CONF, hardware={"backend": "local"}, tracking={"mlflow_uri": "x"}, recipe="a")
    b = dict(reversed(list(CONF.items())), hardware={"backend": "slurm"}, recipe="b")
    assert trial_id(a) == trial_id(b) == GOLDEN


def test_id_sensitive_to_result_changing_fields():
    for change in ({"seed": 1}, {"version": 2}, {"task": {**CONF["task"], "value": 2.0}},
                   {"train": {"steps": 11, "lr": 0.001}}):
        assert trial_id({**CONF, **change}) != GOLDEN


def test_explicit_defaults_do_not_change_ids(tmp_path):
    a = tmp_path / "a.yaml"
    a.write_text("name: a\ntask: {name: debug}\n")
    b = tmp_path / "b.yaml"
    b.write_text("name: b\ntask: {name: debug, steps: 3, sleep_s: 0.0}\ntrain: {steps: 1000}\n"
                 "hardware: {backend: local, max_parallel: 7}\n")
    (ta,), (tb,) = expand(a).trials, expand(b).trials
    assert ta.trial_id == tb.trial_id


def test_golden_recipe_ids(tmp_path):
    p = tmp_path / "g.yaml"
    p.write_text("name: g\ntask: {name: debug}\ngrid: {task.value: [1.0, 2.0]}\nseeds: [0, 1]\n")
    ids = [t.trial_id for t in expand(p).trials]
    assert ids == GOLDEN_RECIPE


GOLDEN_RECIPE = ['dfa5a3344e8b', '033d8cd3f030', '825c56af3941', 'e64dfa623cbf']
