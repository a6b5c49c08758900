"""Recipe arguments: every command takes a recipe file or a recipe name alike.

A name is looked up as: the file the workspace's latest submission of that recipe came from, then
`recipes/NAME.yaml` under the current folder. A file's name is its `name:` key (after `base:` composition), else
its stem.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .errors import RecipeError
from .limits import read_recipe_text


@dataclass
class RecipeRef:
    name: str
    file: Path | None  # None: only known by name (no file found)
    last_submission: dict | None = None  # the workspace's latest submission of this recipe (a plain dict)

    @property
    def last_overrides(self) -> list[str]:
        sub = self.last_submission
        return list(json.loads(sub["overrides"] or "[]")) if sub else []


def _looks_like_file(arg: str) -> bool:
    return arg.endswith((".yaml", ".yml")) or "/" in arg or arg.startswith(".")


def _name_of(path: Path) -> str:
    from .load import read_recipe  # omegaconf (the recipe loader): only when a recipe file is named

    try:
        return str(read_recipe(path).get("name") or path.stem)
    except RecipeError:
        return path.stem


def resolve(arg: str, store=None, need_last: bool = True) -> RecipeRef:
    """Never raises: a name with no file is a RecipeRef whose file is None. `store` may be a callable that opens
    the state store: it is called only when needed (a file argument with `need_last=False` never opens it, so a
    bad recipe file leaves the workspace untouched, not even a SQLite -shm file)."""
    p = Path(arg)
    if p.is_file():
        name = _name_of(p)
        return RecipeRef(name, p, _last(store, name) if need_last else None)
    name = p.stem if _looks_like_file(arg) else arg
    last = _last(store, name)
    if not _looks_like_file(arg):
        if last and last.get("file") and Path(last["file"]).is_file():
            return RecipeRef(name, Path(last["file"]), last)
        for cand in (Path("recipes") / f"{name}.yaml", Path("recipes") / f"{name}.yml"):
            if cand.is_file() and _name_of(cand) == name:
                return RecipeRef(name, cand, last)
    return RecipeRef(name, None, last)


def recipe_file(arg: str, store=None, need_last: bool = True) -> RecipeRef:
    """A RecipeRef with a file, or RecipeError saying where it looked."""
    ref = resolve(arg, store, need_last)
    if ref.file is None:
        if Path(arg).exists():  # a folder, a FIFO, a device: say which (limits.read_recipe_text raises)
            read_recipe_text(Path(arg), arg)
        if _looks_like_file(arg):
            raise RecipeError("no such recipe file", arg)
        raise RecipeError("no such recipe file or recipe name (no submission in the workspace names it and there is "
                          f"no recipes/{arg}.yaml here)", arg)
    return ref


def _last(store, name: str) -> dict | None:
    if callable(store):
        store = store()
    if store is None:
        return None
    subs = store.submissions(name)
    return dict(subs[-1]) if subs else None
