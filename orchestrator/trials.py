"""Recipe → validated list of Trials (resolved config + trial_id).

Each section of each trial is validated by its typed config class (models' ModelConfig, the task's config class,
TrainConfig, EvalConfig, HardwareConfig); identical sections are validated once, so a 100,000-point grid expands
in about a second.
"""
from __future__ import annotations

import copy
import dataclasses
import re
import typing
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from dpx.models.config import ModelConfig
from dpx.tasks import TASKS
from dpx.tasks.training.config import EvalConfig, TrainConfig

from .errors import RecipeError, did_you_mean
from .grid import expand_grid, set_dotted
from .hardware import HardwareConfig
from .identity import canonical_json, section_hash, trial_id
from .load import load_recipe
from .tracking_config import TrackingConfig
from .trial.plugins import NO_MODEL
from .trial.plugins import load as load_plugins

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass
class RecipeMeta:
    """The recipe's own keys (the sections model/task/train/eval are validated per grid point, below)."""
    __pydantic_config__ = {"extra": "ignore"}

    name: str
    """names the recipe's run-dir folder, MLflow experiment and `recipe_<name>` view"""
    description: str = ""
    version: int = 1
    """part of every trial id: bump it to run a recipe's trials anew"""
    seeds: list[int] = field(default_factory=lambda: [0])
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    def __post_init__(self):
        if not NAME_RE.match(self.name):
            raise ValueError("name: must be letters, digits, '_', '.', '-' (it names folders and MLflow experiments)")
        if self.version < 1:
            raise ValueError("version: must be >= 1")
        if not self.seeds:
            raise ValueError("seeds: must list at least one seed")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError("seeds: has duplicates")


@dataclass
class Trial:
    trial_id: str
    recipe: str
    config: dict  # resolved: recipe, version, seed, model, task, train, eval, hardware, tracking, trial_id
    point: dict = field(default_factory=dict)  # the grid point (dotted key → value) incl. seed


@dataclass
class Expansion:
    recipe: str
    file: str
    meta: RecipeMeta
    trials: list[Trial]
    axes: list[str]  # dotted keys that vary across the trials
    raw: dict  # the loaded recipe (after scale and overrides)


def expand(path: str | Path, overrides: list[str] | None = None) -> Expansion:
    file = str(path)
    raw = load_recipe(path, overrides)
    try:
        meta = _adapter(RecipeMeta).validate_python(raw)
    except ValidationError as e:
        raise _pyd_error(e, file, "", RecipeMeta) from None
    base = {s: raw.get(s) if raw.get(s) is not None else {} for s in ("model", "task", "train", "eval")}
    if raw.get("model") is None:
        base["model"] = None
    for s, v in base.items():
        if v is not None and not isinstance(v, dict):
            raise RecipeError(f"must be a mapping, got {type(v).__name__}", file, s)
    points = expand_grid(raw.get("grid"), file)
    hardware = dataclasses.asdict(meta.hardware)
    tracking = dataclasses.asdict(meta.tracking)
    validator = _SectionValidator(file, base)
    trials: dict[str, Trial] = {}
    for point in points:
        sections, sjson = validator.validate(point)
        prefix = section_hash({"version": meta.version}, sjson)
        for seed in meta.seeds:
            conf = {"recipe": meta.name, "version": meta.version, "seed": seed, **sections,
                    "hardware": hardware, "tracking": tracking}
            tid = trial_id(conf, sjson, prefix)
            conf["trial_id"] = tid
            if tid not in trials:  # two grid points that resolve to one config are one trial
                trials[tid] = Trial(tid, meta.name, conf, {**point, "seed": seed})
    out = list(trials.values())
    if not out:
        raise RecipeError("the grid expands to no trial", file, "grid")
    axes = _varying_axes(points, meta.seeds)
    return Expansion(meta.name, file, meta, out, axes, raw)


def _hkey(v: Any) -> Any:
    """A cheap hashable identity for an axis value (type-tagged, so 1, 1.0 and True differ as in JSON)."""
    if v is None or isinstance(v, (str, int, float, bool)):
        return (type(v).__name__, v)
    return ("json", canonical_json(v))


def _varying_axes(points: list[dict], seeds: list[int]) -> list[str]:
    keys: dict[str, set] = {}
    for p in points:
        for k, v in p.items():
            keys.setdefault(k, set()).add(_hkey(v))
    for p in points:  # an axis missing from some blocks varies too (it takes the base value there)
        for k in keys:
            if k not in p:
                keys[k].add(("missing",))
    out = [k for k, vs in keys.items() if len(vs) > 1]
    return out + (["seed"] if len(seeds) > 1 else [])


class _SectionValidator:
    """Validates each section of a grid point with its config class. A section is identified by the grid values
    that fall into it, so each distinct section is built and validated once: a 100,000-point grid whose axes spread
    over sections costs 100,000 dict assemblies and hashes, not 100,000 validations."""

    SECTIONS = ("task", "model", "train", "eval")

    def __init__(self, file: str, base: dict):
        self.file = file
        self.base = base
        self.cache: dict[tuple, tuple[Any, str]] = {}

    def validate(self, point: dict) -> tuple[dict, dict[str, str]]:
        items: dict[str, list] = {s: [] for s in self.SECTIONS}
        for k, v in point.items():
            items[k.split(".", 1)[0]].append((k, v))
        task_name = None
        for k, v in items["task"]:
            if k == "task.name":
                task_name = v
        if task_name is None:
            task_name = (self.base.get("task") or {}).get("name")
        out, sjson = {}, {}
        for s in self.SECTIONS:
            key = (s, task_name if s == "model" else None, tuple((k, _hkey(v)) for k, v in items[s]))
            hit = self.cache.get(key)
            if hit is None:
                raw = copy.deepcopy(self.base.get(s))
                if items[s] and raw is None:
                    raw = {}
                for k, v in items[s]:
                    holder = {s: raw}
                    set_dotted(holder, k, v)
                try:
                    value = self._validate_section(s, raw, task_name)
                except RecipeError as e:
                    if point:
                        e = RecipeError(f"{e.reason} (grid point {_fmt_point(point)})", e.file, e.key)
                    raise e from None
                hit = (value, canonical_json(_non_default(s, value, task_name)))
                self.cache[key] = hit
            out[s], sjson[s] = hit
        self._cross_check(out, task_name, point)
        return out, sjson

    def _cross_check(self, out: dict, task_name: str | None, point: dict) -> None:
        """A task may check the model section against itself (e.g. the vocabulary holds its tokens):
        `TaskConfig.check_model(model: dict)` raising ValueError("model.key: reason")."""
        if out.get("model") is None or not task_name:
            return
        key = ("cross", canonical_json(out["task"]), canonical_json(out["model"]))
        if key in self.cache:
            return
        cls = TASKS[task_name].config_cls()
        check = getattr(cls, "check_model", None)
        if check is not None:
            task_obj = _adapter(cls).validate_python(out["task"])
            try:
                check(task_obj, out["model"])
            except ValueError as e:
                err = _value_error(str(e), self.file, "")
                if point:
                    err = RecipeError(f"{err.reason} (grid point {_fmt_point(point)})", err.file, err.key)
                raise err from None
        self.cache[key] = (None, "")

    def _validate_section(self, section: str, value: Any, task_name: str | None) -> Any:
        if section == "task":
            return _validate_dc(_task_cls(task_name, self.file), value, self.file, "task")
        if section == "model":
            if value is None:
                if _task_needs_model(task_name):
                    raise RecipeError("this task trains a model: add a `model:` section", self.file, "model")
                return None
            return _validate_dc(_model_cls(), value, self.file, "model")
        return _validate_dc(TrainConfig if section == "train" else EvalConfig, value, self.file, section)


def _non_default(section: str, value: Any, task_name: str | None) -> Any:
    """The part of a validated section that differs from its class defaults: what the trial id hashes, so that
    adding a config field with a default (a new feature) keeps every existing trial id."""
    if not isinstance(value, dict):
        return value
    if section == "task":
        cls = TASKS[task_name].config_cls()
    elif section == "model":
        cls = _model_cls()
    else:
        cls = TrainConfig if section == "train" else EvalConfig
    defaults = _default_json(cls)
    return {k: v for k, v in value.items() if k == "name" or defaults.get(k) != _norm(v)}


@lru_cache(maxsize=None)
def _defaults_cached(cls: type) -> tuple:
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            out[f.name] = f.default_factory()  # type: ignore[misc]
    return tuple(out.items())


@lru_cache(maxsize=None)
def _default_json(cls: type) -> dict[str, str]:
    if not dataclasses.is_dataclass(cls):
        return {}
    return {k: _norm(v) for k, v in _defaults_cached(cls)}


def _norm(v: Any) -> str:
    return canonical_json(dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v)


def _fmt_point(point: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in point.items())


def _task_needs_model(name: str | None) -> bool:
    return name not in ("debug",) and name not in NO_MODEL


def _task_cls(name: Any, file: str) -> type:
    load_plugins()  # tasks other packages add through the `dpx.tasks` entry-point group

    if not name:
        raise RecipeError(f"missing; known tasks: {', '.join(sorted(TASKS))}", file, "task.name")
    if not isinstance(name, str):  # a list/dict here is unhashable: `in TASKS` would raise TypeError
        raise RecipeError(f"must be a task name, got {type(name).__name__}; known: {', '.join(sorted(TASKS))}",
                          file, "task.name")
    if name not in TASKS:
        raise RecipeError(f"unknown task {name!r}{did_you_mean(name, TASKS)}; known: {', '.join(sorted(TASKS))}",
                          file, "task.name")
    return TASKS[name].config_cls()


def _model_cls() -> type:
    return ModelConfig


@lru_cache(maxsize=None)
def _adapter(cls: type) -> TypeAdapter:
    return TypeAdapter(cls)


def _validate_dc(cls: type, value: Any, file: str, section: str) -> dict:
    if not isinstance(value, dict):
        raise RecipeError(f"must be a mapping, got {type(value).__name__}", file, section)
    try:
        obj = _adapter(cls).validate_python(value)
    except ValidationError as e:
        raise _pyd_error(e, file, section, cls) from None
    except (ValueError, TypeError) as e:  # raised by a config class outside pydantic's wrapping
        raise _value_error(str(e), file, section) from None
    return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else obj.model_dump()


def _field_names(cls: Any) -> list[str]:
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)]
    return list(getattr(cls, "model_fields", {}))


def _field_type(cls: Any, name: str) -> Any:
    """The class of field `name` of a dataclass or pydantic model, or None."""
    if dataclasses.is_dataclass(cls):
        try:
            return typing.get_type_hints(cls).get(name)
        except (NameError, TypeError):
            return None
    fld = getattr(cls, "model_fields", {}).get(name)
    return fld.annotation if fld is not None else None


def _pyd_error(e: ValidationError, file: str, section: str, cls: Any) -> RecipeError:
    err = e.errors()[0]
    loc = [str(x) for x in err["loc"]]
    path = ".".join([section] + loc if section else loc)
    etype, msg = err["type"], err["msg"]
    if etype in ("extra_forbidden", "unexpected_keyword_argument"):
        owner = cls
        for part in loc[:-1]:  # nested section: find the owning class for the did-you-mean
            owner = _field_type(owner, part) or owner
        return RecipeError(f"unknown key{did_you_mean(loc[-1], _field_names(owner))}", file, path)
    if etype in ("value_error", "assertion_error"):
        return _value_error(msg.removeprefix("Value error, ").removeprefix("Assertion failed, "), file, path)
    if etype == "missing":
        return RecipeError("required key is missing", file, path)
    return RecipeError(f"{msg} (got {err.get('input')!r})", file, path)


def _value_error(msg: str, file: str, path: str) -> RecipeError:
    """Config classes raise ValueError('key: reason'); turn it into section.key + reason."""
    m = re.match(r"^([A-Za-z_][\w.\[\]]*): (.*)$", msg, re.S)
    if m:
        return RecipeError(m.group(2).strip(), file, f"{path}.{m.group(1)}" if path else m.group(1))
    return RecipeError(msg.strip(), file, path or None)
