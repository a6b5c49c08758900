"""Fuzzed bad recipes (hypothesis): every malformed or mistyped recipe ends in exactly one line on stderr, exit
status 2, no traceback, and a workspace that is byte-for-byte unchanged.

Extends the hand-written cases of test_orchestrator_schema.py: here the recipes are generated, starting from a
valid one and breaking it in one or more ways that are each invalid by construction (so every example must be
rejected). The CLI runs in-process (`dpx.orchestrator.cli.main`, as the `dpx` script does) so that a few hundred
examples take seconds; the subprocess path is covered by test_orchestrator_schema.py.
"""
from __future__ import annotations

import contextlib
import io
import math
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpx.orchestrator import cli
from dpx.orchestrator.load import TOP_KEYS

FIELDS = {  # section → {field: kind} of the fields mutated below (debug task, shared train/eval, hardware)
    "task": {"steps": "int", "sleep_s": "float", "value": "float", "fail": "bool", "exit_code": "int",
             "nan_at_step": "int", "fail_on_attempts": "int", "checkpoint": "bool"},
    "train": {"steps": "int", "batch_size": "int", "lr": "float", "warmup_steps": "int", "grad_clip": "float",
              "compile": "bool"},
    "eval": {"batch_size": "int", "num_samples": "int"},
    "hardware": {"max_parallel": "int", "cpus_per_trial": "float", "max_retries": "int", "timeout_min": "float"},
}
OUT_OF_RANGE = [  # (section, field, values that are the right type but out of range)
    ("task", "steps", st.integers(max_value=-1)),
    ("task", "sleep_s", st.floats(max_value=-1e-6, allow_nan=False, allow_infinity=False)),
    ("train", "steps", st.integers(max_value=0)),
    ("train", "batch_size", st.integers(max_value=0)),
    ("train", "lr", st.floats(max_value=0.0, allow_nan=False, allow_infinity=False)),
    ("train", "schedule", st.sampled_from(["cosin", "Cosine", "", "step"])),
    ("train", "precision", st.sampled_from(["fp16", "bf32", "AUTO"])),
    ("hardware", "max_parallel", st.integers(max_value=0)),
    ("hardware", "max_retries", st.integers(max_value=-1)),
    ("hardware", "cpus_per_trial", st.floats(max_value=0.0, allow_nan=False, allow_infinity=False)),
    ("hardware", "timeout_min", st.floats(max_value=0.0, allow_nan=False, allow_infinity=False)),
    ("hardware", "backend", st.text(min_size=1, max_size=12).filter(lambda s: s not in ("local", "ray", "slurm"))),
    ("hardware", "device", st.text(max_size=8).filter(lambda s: s not in ("auto", "cpu", "cuda"))),
]
NUMBER_WORDS = {"inf", "+inf", "-inf", "infinity", "+infinity", "-infinity", "nan", "+nan", "-nan"}
BOOL_WORDS = {"0", "1", "t", "f", "y", "n", "true", "false", "yes", "no", "on", "off"}  # pydantic's lax bools


def _numeric(s: str) -> bool:
    """Text a numeric field would accept after all (pydantic's lax mode parses "1_000", " 3 ", "inf", "1e3")."""
    t = s.strip().replace("_", "")
    if t.lower() in NUMBER_WORDS:
        return True
    try:
        float(t)
        return True
    except ValueError:
        return False


texts = st.text(max_size=20).filter(lambda s: "$" not in s)  # `${...}` interpolations are fuzzed on their own
containers = st.one_of(st.lists(st.integers(), max_size=3), st.dictionaries(st.text("abc", min_size=1, max_size=3),
                                                                            st.integers(), max_size=2))


def bad_value(kind: str) -> st.SearchStrategy:
    """A value no field of `kind` accepts (even in pydantic's lax mode)."""
    non_numeric = texts.filter(lambda s: not _numeric(s) and s.strip().lower() not in BOOL_WORDS)
    if kind == "int":
        fractional = st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: f != math.floor(f))
        return st.one_of(non_numeric, containers, fractional)
    if kind == "float":
        return st.one_of(non_numeric, containers)
    return st.one_of(non_numeric, containers, st.integers().filter(lambda i: i not in (0, 1)),
                     st.floats(allow_nan=False).filter(lambda f: f not in (0.0, 1.0)))


identifier = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True)
odd_keys = st.one_of(identifier, st.text(min_size=1, max_size=12),
                     st.sampled_from(["[/bold]", "[red]x[/red]", "a\nb", "tab\there", "ü", "[", "]", "\\", "null"]))


def base_recipe() -> dict:
    return {"name": "fz", "task": {"name": "debug", "steps": 1}, "train": {}, "eval": {},
            "hardware": {"max_parallel": 1}, "grid": {"train.log_every": [1, 2]}}


@st.composite
def mutation(draw) -> tuple[str, object]:
    """One way of breaking a recipe: ('dict', fn(recipe) -> None) or ('text', fn(yaml_text) -> text)
    or ('override', [key=value ...])."""
    kind = draw(st.sampled_from(["top_key", "section_key", "wrong_type", "out_of_range", "task_name", "name",
                                 "section_type", "grid", "seeds", "interp", "override", "raw"]))
    if kind == "top_key":
        k, v = draw(odd_keys.filter(lambda k: k not in TOP_KEYS)), draw(st.integers())
        return "dict", lambda r: r.__setitem__(k, v)
    if kind == "section_key":
        sec = draw(st.sampled_from(sorted(FIELDS)))
        k, v = draw(odd_keys.filter(lambda k: k not in _all_fields(sec))), draw(st.integers(0, 3))
        return "dict", lambda r: r[sec].__setitem__(k, v)
    if kind == "wrong_type":
        sec = draw(st.sampled_from(sorted(FIELDS)))
        f, fkind = draw(st.sampled_from(sorted(FIELDS[sec].items())))
        v = draw(bad_value(fkind))
        if draw(st.booleans()) and sec != "hardware":  # the bad value on a grid axis instead of the section
            ok = draw(st.integers(0, 2))
            return "dict", lambda r: r["grid"].__setitem__(f"{sec}.{f}", [ok, v])
        return "dict", lambda r: r[sec].__setitem__(f, v)
    if kind == "out_of_range":
        sec, f, strat = draw(st.sampled_from(OUT_OF_RANGE))
        v = draw(strat)
        return "dict", lambda r: r[sec].__setitem__(f, v)
    if kind == "task_name":
        from dpx.tasks import TASKS

        v = draw(st.one_of(texts.filter(lambda s: s not in TASKS), st.integers(), containers))
        return "dict", lambda r: r["task"].__setitem__("name", v)
    if kind == "name":
        v = draw(st.text(max_size=10).filter(lambda s: not _valid_name(s)))
        return "dict", lambda r: r.__setitem__("name", v)
    if kind == "section_type":
        sec = draw(st.sampled_from(["task", "train", "eval", "hardware", "model", "tracking"]))
        v = draw(st.one_of(st.text(min_size=1, max_size=8).filter(lambda s: s.strip() and s.strip() != "~"
                                                                   and s.strip().lower() != "null"),
                           st.lists(st.integers(), min_size=1, max_size=3), st.integers(), st.booleans()))
        return "dict", lambda r: r.__setitem__(sec, v)
    if kind == "grid":
        how = draw(st.sampled_from(["empty_axis", "zip_len", "axis_key", "not_mapping", "zip_not_list"]))
        if how == "empty_axis":
            return "dict", lambda r: r["grid"].__setitem__("task.steps", [])
        if how == "zip_len":
            n = draw(st.integers(1, 3))
            return "dict", lambda r: r["grid"].__setitem__("zip", {"task.steps": list(range(n)),
                                                                    "task.exit_code": list(range(n + 1))})
        if how == "axis_key":
            k = draw(odd_keys.filter(lambda k: k.split(".", 1)[0] not in ("model", "task", "train", "eval")))
            return "dict", lambda r: r["grid"].__setitem__(k, [1, 2])
        if how == "zip_not_list":
            n = draw(st.integers(0, 3))
            return "dict", lambda r: r["grid"].__setitem__("zip", {"task.steps": n})
        v = draw(st.one_of(st.integers(), st.text(min_size=1, max_size=5).filter(str.strip),
                           st.lists(st.integers(), min_size=1, max_size=2)))
        return "dict", lambda r: r.__setitem__("grid", v)
    if kind == "seeds":
        v = draw(st.one_of(st.just([]), st.integers().map(lambda i: [i, i]),
                           st.lists(texts.filter(lambda s: not _numeric(s)), min_size=1, max_size=2)))
        return "dict", lambda r: r.__setitem__("seeds", v)
    if kind == "interp":
        target = draw(st.sampled_from(["${nope}", "${task.nope}", "${", "${oc.env:DPX_FUZZ_UNSET_VAR}",
                                       "${oc.nope:x}", "${task.steps"]))
        return "dict", lambda r: r["task"].__setitem__("steps", target)
    if kind == "override":
        how = draw(st.sampled_from(["no_eq", "section", "bad_value", "scale"]))
        if how == "no_eq":
            return "override", [draw(st.text(min_size=1, max_size=10).filter(lambda s: "=" not in s
                                                                            and not s.startswith("-")))]
        if how == "section":
            k = draw(identifier.filter(lambda k: k not in TOP_KEYS or k == "scales"))
            return "override", [f"{k}.x=1"]
        if how == "scale":
            return "override", [f"scale={draw(identifier)}"]
        f = draw(st.sampled_from(["steps", "exit_code", "nan_at_step"]))
        v = draw(st.sampled_from(["abc", "[1, 2]", "{a: 1}", "1.5", "x y"]))
        return "override", [f"task.{f}={v}"]
    # raw text damage: invalid YAML, binary, control characters, non-mapping documents
    how = draw(st.sampled_from(["unbalanced", "binary", "control", "scalar", "list", "tab_indent"]))
    if how == "unbalanced":
        return "text", lambda t: t + "\nextra: {a: [1, 2\n"
    if how == "binary":
        junk = draw(st.binary(max_size=20))
        return "bytes", lambda t: b"\xff\xfe" + junk + t.encode()
    if how == "control":
        c = draw(st.sampled_from(["\x00", "\x01", "\x07", "\x1b", "\x7f", "\ufffe"]))
        return "text", lambda t: t.replace("fz", f"f{c}z", 1)
    if how == "scalar":
        doc = draw(st.sampled_from(["42", "just text", "'quoted'", "3.5", "true"]))
        return "text", lambda t: doc + "\n"
    if how == "list":
        return "text", lambda t: "- " + "\n- ".join(t.splitlines()[:2]) + "\n"
    return "text", lambda t: t + "task:\n\tsteps: 2\n"


def _all_fields(section: str) -> set[str]:
    import dataclasses

    from dpx.orchestrator.hardware import HardwareConfig
    from dpx.tasks.debug.config import DebugConfig
    from dpx.tasks.training.config import EvalConfig, TrainConfig

    cls = {"task": DebugConfig, "train": TrainConfig, "eval": EvalConfig}.get(section, HardwareConfig)
    return {f.name for f in dataclasses.fields(cls)}


def _valid_name(s: str) -> bool:
    import re

    return bool(re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", s))


@st.composite
def bad_recipes(draw) -> tuple[bytes, list[str]]:
    r = base_recipe()
    muts = draw(st.lists(mutation(), min_size=1, max_size=3))
    overrides: list[str] = []
    text_fns, byte_fns = [], []
    for kind, m in muts:
        if kind == "dict":
            try:  # an earlier mutation may have replaced the section this one edits: it is invalid already
                m(r)
            except (TypeError, KeyError, AttributeError):
                pass
        elif kind == "override":
            overrides += m
        elif kind == "text":
            text_fns.append(m)
        else:
            byte_fns.append(m)
    text = yaml.safe_dump(r, sort_keys=False, allow_unicode=draw(st.booleans()))
    for fn in text_fns:
        text = fn(text)
    data = text.encode()
    for fn in byte_fns:
        data = fn(text)
    return data, overrides


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under root (folders too) with the bytes of each file."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def run_cli(*argv: str) -> tuple[int, str, str, BaseException | None]:
    """`dpx ARGV` in-process, as the console script runs it; returns (exit code, stdout, stderr, escaped exc)."""
    o, e = io.StringIO(), io.StringIO()
    old = sys.argv
    sys.argv = ["dpx", *argv]
    code, exc = 0, None
    try:
        with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
            cli.main()
    except SystemExit as x:
        code = x.code if isinstance(x.code, int) else (0 if x.code is None else 1)
    except BaseException as x:  # noqa: BLE001 — an escaped exception is exactly what the test must catch
        code, exc = -1, x
    finally:
        sys.argv = old
    return code, o.getvalue(), e.getvalue(), exc


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """A workspace with prior state (a registered submission and a run dir), made without starting a driver."""
    from dpx.orchestrator.state import StateStore
    from dpx.orchestrator.trials import expand
    from dpx.orchestrator.workspace import Workspace

    root = tmp_path_factory.mktemp("fuzz")
    good = root / "good.yaml"
    good.write_text(yaml.safe_dump(base_recipe()))
    ex = expand(good)
    ws = Workspace(root / "ws").create()
    store = StateStore(ws.state_db)
    store.add_submission("s0", ex.recipe, str(good), [], "local", ex.trials, lambda t: ws.run_dir(ex.recipe, t.trial_id))
    store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    d = ws.run_dir(ex.recipe, ex.trials[0].trial_id)
    d.mkdir(parents=True)
    (d / "result.json").write_text('{"status": "completed"}')
    return root


def check_rejected(root: Path, cmd: str, data: bytes, overrides: list[str]) -> None:
    recipe = root / "bad.yaml"
    recipe.write_bytes(data)
    before = snapshot(root)
    argv = [cmd, str(recipe), *overrides]
    if cmd == "submit":
        argv += ["--workspace", str(root / "ws")]
    code, out, err, exc = run_cli(*argv)
    shown = f"recipe bytes {data!r}, overrides {overrides}\nstdout: {out!r}\nstderr: {err!r}"
    assert exc is None, f"exception escaped: {type(exc).__name__}: {exc}\n{shown}"
    assert code == 2, shown
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, shown
    assert lines[0].startswith("error: ") and str(recipe) in lines[0], shown
    assert "Traceback" not in out + err and out == "", shown
    assert snapshot(root) == before, "workspace changed\n" + shown


FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                        HealthCheck.too_slow])


@FUZZ
@given(bad=bad_recipes())
def test_fuzzed_bad_recipe_expand(workspace, bad):
    check_rejected(workspace, "expand", *bad)


@settings(FUZZ, max_examples=100)
@given(bad=bad_recipes())
def test_fuzzed_bad_recipe_submit(workspace, bad):
    check_rejected(workspace, "submit", *bad)


def test_generator_breaks_only_what_it_means_to(workspace):
    """The base recipe is valid (else every example would pass for the wrong reason)."""
    good = workspace / "base.yaml"
    good.write_text(yaml.safe_dump(base_recipe()))
    code, out, err, exc = run_cli("expand", str(good))
    assert exc is None and code == 0, err
    assert "2 trials" in out
