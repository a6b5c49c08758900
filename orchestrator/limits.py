"""Bounds on what a recipe may ask for, checked before anything is expanded, written or run (issue 16).

Reading: regular files only (a FIFO or /dev/zero once hung `expand`, `submit` and `status`), at most
MAX_RECIPE_BYTES; YAML composed by a loader that caps nesting depth (MAX_DEPTH: 100 nested lists ended in a
400-line RecursionError), refuses an anchor that contains itself, refuses duplicate keys (the last one silently
won), and counts the nodes the document expands to with every alias unfolded (MAX_NODES: a "billion laughs" took
minutes and hundreds of MB in OmegaConf). Each is one line naming the file and the reason.

Values, after the scale and overrides are applied: the recipe name (a trailing newline passed `NAME_RE`'s `$`, a
300-character name failed every trial with "File name too long"), seeds (0 <= seed < 2^63), no NaN or infinity
anywhere (`train.lr=nan`, `hardware.cpus_per_trial: .nan`, NaN timeout_min or gpus_per_trial), model sizes
within MODEL_LIMITS and an estimated parameter count below MAX_PARAMS (`model.num_householder=1000000000` and a
hidden size of 2^40 were accepted, then tried to allocate terabytes, retried), a plain MLflow experiment name (a
path put MLflow's artefacts outside the workspace), and the grid size (`max_trials()`, 100,000 unless
`--max-trials` raises it: a 1e6-point grid took 97 s and 1.9 GB before any warning).

Paths (`check_paths`): a path a recipe file names (`task.checkpoint`, `task.cache_dir`, `task.lm_eval.data_dir`,
`tracking.mlflow_uri`, in a section, a scale or a grid) stays inside the workspace: relative (a trial runs in its
run dir) without `..`; an absolute path, `~` or a local MLflow store is refused unless the user types it on the
command line (`task.checkpoint=/data/ckpt`), because a recipe someone shares must not read or write elsewhere.
"""
from __future__ import annotations

import math
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from .errors import RecipeError

MAX_RECIPE_BYTES = 1 << 20  # 1 MiB: the largest recipe in recipes/ is a few KB
MAX_DEPTH = 32  # nesting levels of the YAML document (a recipe uses about 5)
MAX_NODES = 200_000  # YAML nodes with every alias expanded
DEFAULT_MAX_TRIALS = 100_000
MAX_NAME_LEN = 100
SEED_LIMIT = 1 << 63  # seeds are stored as signed 64-bit integers (SQLite, DuckDB)
MAX_PARAMS = 1e12  # an estimated parameter count above this cannot be held by any one node
MODEL_LIMITS = {
    "hidden_size": 1 << 16, "num_layers": 1024, "num_heads": 1024, "head_dim": 4096, "num_householder": 64,
    "n_h": 64, "vocab_size": 1 << 22, "intermediate_size": 1 << 20, "state_size": 1 << 16, "expand": 64,
    "conv_size": 1024, "low_rank_dim": 1 << 16, "chunk_size": 1 << 16, "num_classes": 1 << 22,
}
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
EXPERIMENT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_. -]*")
NONFINITE_TEXT = re.compile(r"[+-]?(nan|inf|infinity)", re.IGNORECASE)

_max_trials = DEFAULT_MAX_TRIALS


def set_max_trials(n: int | None) -> None:
    """`--max-trials N` (the CLI calls this before expanding); None restores the default."""
    global _max_trials
    _max_trials = DEFAULT_MAX_TRIALS if n is None else int(n)


def max_trials() -> int:
    return _max_trials


# ---- reading ----------------------------------------------------------------------------------------------------
def read_recipe_text(path: Path, file: str) -> str:
    """The recipe's text: a regular file, at most MAX_RECIPE_BYTES, UTF-8. Opened non-blocking, so a FIFO put in
    its place between the check and the open cannot hang us either."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise RecipeError(f"cannot read the recipe: {e.strerror or e}", file) from None
    if not stat.S_ISREG(st.st_mode):
        kind = ("a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else
                "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else
                "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
        raise RecipeError(f"not a regular file ({kind}); a recipe is a YAML file", file)
    if st.st_size > MAX_RECIPE_BYTES:
        raise RecipeError(f"{st.st_size} bytes, above the {MAX_RECIPE_BYTES}-byte limit for a recipe", file)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise RecipeError(f"cannot read the recipe: {e.strerror or e}", file) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RecipeError("not a regular file; a recipe is a YAML file", file)
        chunks, n = [], 0
        while n <= MAX_RECIPE_BYTES:
            b = os.read(fd, 1 << 16)
            if not b:
                break
            chunks.append(b)
            n += len(b)
    except OSError as e:
        raise RecipeError(f"cannot read the recipe: {e.strerror or e}", file) from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > MAX_RECIPE_BYTES:
        raise RecipeError(f"more than {MAX_RECIPE_BYTES} bytes, the limit for a recipe", file)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RecipeError(f"not UTF-8 text (byte {e.start}: {e.object[e.start:e.start + 1]!r})", file) from None


def is_regular_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


class _LimitError(Exception):
    def __init__(self, reason: str, line: int | None = None):
        self.reason, self.line = reason, line


class BoundedLoader(yaml.SafeLoader):
    """SafeLoader with a depth cap while composing, no self-containing anchors, an expanded-size cap and no
    duplicate keys."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise _LimitError(f"nested more than {MAX_DEPTH} levels deep", mark.line + 1)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self):
        node = super().compose_document()
        _measure(node)
        return node

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for k, _ in node.value:
                if isinstance(k, yaml.ScalarNode) and k.tag != "tag:yaml.org,2002:merge":
                    key = (k.tag, k.value)
                    if key in seen:
                        raise _LimitError(f"key {k.value!r} appears twice in one mapping (the second would "
                                          f"silently replace the first)", k.start_mark.line + 1)
                    seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _measure(root) -> None:
    """Nodes of the document with every alias unfolded, without unfolding them (sizes memoised per node); an
    anchor inside itself is a cycle."""
    if root is None:
        return
    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Any, int]] = [(root, 0)]
    while stack:
        node, state = stack.pop()
        nid = id(node)
        kids = _children(node)
        if state == 0:
            if nid in size:
                continue
            if nid in on_path:
                raise _LimitError("an anchor refers to itself (a recursive alias)", node.start_mark.line + 1)
            on_path.add(nid)
            stack.append((node, 1))
            for k in kids:
                if id(k) in on_path:
                    raise _LimitError("an anchor refers to itself (a recursive alias)", k.start_mark.line + 1)
                if id(k) not in size:
                    stack.append((k, 0))
        else:
            on_path.discard(nid)
            total = 1 + sum(size[id(k)] for k in kids)
            if total > MAX_NODES:
                raise _LimitError(f"expands to more than {MAX_NODES} values once its aliases are unfolded "
                                  f"(an alias bomb?)", node.start_mark.line + 1)
            size[nid] = total


def _children(node) -> list:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [x for kv in node.value for x in kv]
    return []


def load_yaml(text: str, file: str, where: str | None = None) -> Any:
    """yaml.safe_load with the bounds above; RecipeError (one line) on anything wrong."""
    try:
        return yaml.load(text, Loader=BoundedLoader)  # noqa: S506 (a SafeLoader subclass)
    except _LimitError as e:
        raise RecipeError(e.reason, file, where or (f"line {e.line}" if e.line else None)) from None
    except RecursionError:
        raise RecipeError(f"nested too deeply (more than {MAX_DEPTH} levels)", file, where) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        w = where or (f"line {mark.line + 1}" if mark else None)
        raise RecipeError(f"invalid YAML: {getattr(e, 'problem', None) or e}", file, w) from None


# ---- values -----------------------------------------------------------------------------------------------------
def check_recipe(out: dict, file: str) -> None:
    """The resolved recipe (file + scale + overrides): values a trial would reject at run time, and the grid size."""
    name = out.get("name")
    if isinstance(name, str):
        if not NAME_RE.fullmatch(name):
            raise RecipeError("must be letters, digits, '_', '.', '-' and nothing else, no line break (it names "
                              "folders and MLflow experiments)", file, "name")
        if len(name) > MAX_NAME_LEN:
            raise RecipeError(f"{len(name)} characters, above the {MAX_NAME_LEN}-character limit (it names folders)",
                              file, "name")
    for path, v in _walk(out, ""):
        if path.startswith(("description", "scales")):
            continue
        if isinstance(v, float) and not math.isfinite(v):
            raise RecipeError(f"{v} is not a usable value (NaN and infinity are refused)", file, path)
        if isinstance(v, str) and NONFINITE_TEXT.fullmatch(v.strip()) and not path.startswith(("name", "tracking")):
            raise RecipeError(f"{v!r} is not a usable value (NaN and infinity are refused)", file, path)
    seeds = out.get("seeds")
    for i, s in enumerate(seeds if isinstance(seeds, list) else [seeds] if seeds is not None else []):
        if isinstance(s, int) and not isinstance(s, bool) and not 0 <= s < SEED_LIMIT:
            raise RecipeError(f"seed {s} is out of range (0 <= seed < 2^63)", file, f"seeds[{i}]")
    tracking = out.get("tracking")
    exp = tracking.get("experiment") if isinstance(tracking, dict) else None
    if isinstance(exp, str) and (not EXPERIMENT_RE.fullmatch(exp) or ".." in exp or len(exp) > MAX_NAME_LEN):
        raise RecipeError("must be a plain name (letters, digits, '_', '.', '-', spaces), not a path: it names "
                          "the MLflow experiment, whose artefacts stay inside the workspace", file,
                          "tracking.experiment")
    _check_model_sizes(out, file)
    n = grid_size(out.get("grid")) * (len(seeds) if isinstance(seeds, list) and seeds else 1)
    if n > _max_trials:
        raise RecipeError(f"the grid expands to {n} trials, above the limit of {_max_trials}; pass --max-trials "
                          f"{n} to run it anyway", file, "grid")


PATH_FIELDS = ("checkpoint", "cache_dir", "data_dir", "mlflow_uri")  # leaf keys that hold a file-system path
REMOTE_URI = re.compile(r"https?://", re.IGNORECASE)  # an MLflow tracking server: not a path


def check_paths(out: dict, file: str, cli_keys: set[str]) -> None:
    """Refuse a path from the recipe file that leaves the workspace; `cli_keys` (dotted keys the user typed on the
    command line) are the user's own choice and pass."""
    for path, v in _walk({k: out.get(k) for k in ("task", "tracking", "grid", "model", "train", "eval")}, ""):
        key = re.sub(r"\[\d+\]", "", path)  # grid[0].task.checkpoint[1] -> grid.task.checkpoint
        key = key[len("grid."):] if key.startswith("grid.") else key
        if key.rsplit(".", 1)[-1] not in PATH_FIELDS or not isinstance(v, str) or not v or key in cli_keys:
            continue
        if key.endswith("mlflow_uri"):
            if not REMOTE_URI.match(v):
                raise RecipeError(f"{v!r}: a recipe may name an MLflow server (http://HOST:PORT), not a local store; "
                                  f"pass it on the command line ({key}=...) or set DPX_MLFLOW_URI", file, path)
            continue
        parts = Path(v).parts
        if v.startswith(("/", "~")) or ".." in parts or "://" in v:
            raise RecipeError(f"{v!r} leaves the workspace (paths in a recipe are relative to the trial's run dir, "
                              f"without '..'); pass it on the command line ({key}={v}) to use it anyway", file, path)


def _walk(v: Any, path: str):
    stack = [(path, v)]
    while stack:
        p, x = stack.pop()
        if isinstance(x, dict):
            stack += [(f"{p}.{k}" if p else str(k), y) for k, y in x.items()]
        elif isinstance(x, list):
            stack += [(f"{p}[{i}]", y) for i, y in enumerate(x)]
        else:
            yield p, x


def _axis_values(grid: Any, key: str) -> list:
    """Every value a grid gives the dotted key (all blocks, zip groups included)."""
    out: list = []
    for block in grid if isinstance(grid, list) else [grid] if isinstance(grid, dict) else []:
        if not isinstance(block, dict):
            continue
        zips = block.get("zip")
        groups = [g for g in (zips if isinstance(zips, list) else [zips]) if isinstance(g, dict)]
        for src in [block] + groups:
            if key in src:
                v = src[key]
                out += v if isinstance(v, list) else [v]
    return out


def _check_model_sizes(out: dict, file: str) -> None:
    model = out.get("model") if isinstance(out.get("model"), dict) else {}
    biggest: dict[str, int] = {}
    for field, limit in MODEL_LIMITS.items():
        where = [("model." + field, model.get(field))] + [
            (f"grid: model.{field}", v) for v in _axis_values(out.get("grid"), f"model.{field}")]
        for key, v in where:
            if isinstance(v, int) and not isinstance(v, bool):
                if v > limit:
                    raise RecipeError(f"{v} is above the limit of {limit} for {field} (no node could hold the "
                                      f"model)", file, key)
                biggest[field] = max(biggest.get(field, 0), v)
    d, layers = biggest.get("hidden_size", 0), biggest.get("num_layers", 0)
    est = layers * 16 * d * d + 2 * biggest.get("vocab_size", 0) * d
    if est > MAX_PARAMS:
        raise RecipeError(f"about {est:.2g} parameters at hidden_size {d} and {layers} layers, above the "
                          f"{MAX_PARAMS:.0e} that any node can hold", file, "model")


def grid_size(grid: Any) -> int:
    """Points of the grid without expanding it (the grammar of grid.py: blocks add, axes multiply, a zip group
    counts its length). Malformed parts count 1: expand_grid reports them."""
    if grid is None or grid == {} or grid == []:
        return 1
    total = 0
    for block in grid if isinstance(grid, list) else [grid]:
        if not isinstance(block, dict):
            total += 1
            continue
        n = 1
        for key, values in block.items():
            if key == "zip":
                for g in values if isinstance(values, list) else [values]:
                    if isinstance(g, dict) and g:
                        first = next(iter(g.values()))
                        n *= len(first) if isinstance(first, list) else 1
            else:
                n *= len(values) if isinstance(values, list) else 1
        total += n
    return total
