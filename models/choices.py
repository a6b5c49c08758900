"""Choice fields of the model and task config classes: typed `Literal[...]`, checked here with one message.

(It lives in models, the lowest layer with config classes, so that models/config.py and tasks/*/config.py share
it; tasks import models, never the other way.) A config class derives from `Choices` and calls `check_choices(self)` in its `__post_init__`:

- the runner (a bare node, no pydantic) builds the stdlib dataclass directly: `check_choices` raises
  ValueError("group: unknown group 'S7'; known: S3, S4, A5, S5") from the Literal types;
- the orchestrator validates recipe sections with pydantic, which would reject a bad choice itself with "Input
  should be 'S3', 'S4', 'A5' or 'S5'" before `__post_init__` runs; `Choices` runs the same check on the raw mapping
  first, so a recipe error reads the same as the runner's (with its did-you-mean), "file:task.group: unknown ...".

Standard library only (pydantic is imported only when pydantic asks for the schema).
"""
from __future__ import annotations

import dataclasses
import difflib
import typing
from functools import cache
from typing import Any, Callable, Literal



def did_you_mean(value: str, choices, cutoff: float = 0.6) -> str:
    """' (did you mean X?)' for the closest of `choices`, or ''; shared by every config class and the loader."""
    close = difflib.get_close_matches(str(value), list(choices), n=1, cutoff=cutoff)
    return f" (did you mean {close[0]!r}?)" if close else ""


def literal_values(tp: Any) -> tuple:
    """The values of a Literal type (() for any other type)."""
    return typing.get_args(tp) if typing.get_origin(tp) is Literal else ()


@cache
def _choice_fields(cls: type) -> tuple[tuple[str, tuple, bool], ...]:
    """(field name, allowed values, is a list of them) of every Literal / list[Literal] field of `cls`."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if values := literal_values(tp):
            out.append((f.name, values, False))
        elif typing.get_origin(tp) is list and (values := literal_values(typing.get_args(tp)[0])):
            out.append((f.name, values, True))
    return tuple(out)


def _check(cls: type, get: Callable[[str], Any], prefix: str) -> None:
    missing = object()
    for name, values, many in _choice_fields(cls):
        v = get(name, missing)
        if v is missing or (many and not isinstance(v, list)):
            continue  # a default, or a wrong type: pydantic says so
        for x in (v if many else [v]):
            if not isinstance(x, typing.Hashable) or x not in values:
                noun = (name.removesuffix("s") if many else name).replace("_", " ")
                raise ValueError(f"{prefix}{name}: unknown {noun} {x!r}{did_you_mean(str(x), values, cutoff=0.4)}; "
                                 f"known: {', '.join(map(str, values))}")


def check_choices(obj: Any, prefix: str = "") -> None:
    """Raise ValueError("<prefix><key>: unknown <key> 'x' (did you mean ...?); known: a, b") for the first value of
    a Literal field of the dataclass `obj` that is not one of its choices."""
    _check(type(obj), lambda name, default: getattr(obj, name), prefix)


class Choices:
    """Mixin of the task config dataclasses: pydantic checks the choice fields with `check_choices`' message."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema  # pydantic: only the orchestrator's validation gets here

        def pre(value: Any) -> Any:
            if isinstance(value, dict):
                _check(cls, value.get, "")
            return value

        return core_schema.no_info_before_validator_function(pre, handler(source))
