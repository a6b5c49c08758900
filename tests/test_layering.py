"""The import layering of dpx, read from the source with `ast` (module-level and function-level imports alike):

    orchestrator -> tasks -> models -> kernels        (each may import the ones to its right)
    orchestrator -> registry                          (the registry imports no other dpx package)
    everything   -> dpx.rundir, dpx                   (the run-dir contract at the bottom; `dpx` for __version__)

and, inside the orchestrator, the trial side (`orchestrator/trial/`: what runs in a trial's process) imports
neither the control side nor pydantic, mlflow, ray, omegaconf or duckdb. No import cycle between any two modules;
no import inside a function in orchestrator/, registry/ or dpx/ without a comment saying which heavy dependency it
keeps off which path. Subprocesses check what the cheap imports really load (sys.modules).
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("orchestrator", "registry", "tasks", "models", "kernels", "dpx")
MAY_IMPORT = {  # a package -> the dpx packages it may import ("dpx": dpx itself and dpx.rundir)
    "orchestrator": {"orchestrator", "tasks", "models", "kernels", "registry", "dpx"},
    "tasks": {"tasks", "models", "kernels", "dpx"},
    "models": {"models", "kernels", "dpx"},
    "kernels": {"kernels", "dpx"},
    "registry": {"registry", "dpx"},
    "dpx": {"dpx"},
}
BOTTOM = {"dpx", "dpx.rundir"}  # what every layer may import of the `dpx` package itself
TRIAL = "dpx.orchestrator.trial"
TRIAL_FORBIDDEN = {"pydantic", "mlflow", "ray", "omegaconf", "duckdb"}
LAZY_COMMENTED = ("orchestrator", "registry", "dpx")  # function-level imports there say why (a comment)

# Import cycles a change may leave for a while (importing module, module its import names; that import is left out
# of the cycle check). Empty: every cycle is gone. An entry that no longer closes a cycle fails test_no_import_cycles.
KNOWN_CYCLE_EDGES: set[tuple[str, str]] = set()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts if parts[0] == "dpx" else ["dpx", *parts])


def _sources() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            if "__pycache__" not in p.parts:
                out[_module_name(p)] = p
    return out


MODULES = _sources()


class Import:
    def __init__(self, module: str, target: str, line: int, lazy: bool, commented: bool):
        self.module, self.target, self.line, self.lazy, self.commented = module, target, line, lazy, commented

    def __repr__(self) -> str:
        return f"{MODULES[self.module].relative_to(ROOT)}:{self.line} imports {self.target}"


def _imports(module: str) -> list[Import]:
    """Every import statement of the module, as absolute names (`from a import b` gives a.b when that is a module,
    else a), with whether it sits in a function and carries a comment (its line, or the one above)."""
    path = MODULES[module]
    text = path.read_text()
    lines = text.splitlines()
    tree = ast.parse(text)
    pkg = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    in_function: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_function |= {id(n) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                src = ".".join(base + ([node.module] if node.module else []))
            else:
                src = node.module or ""
            targets = [f"{src}.{a.name}" if f"{src}.{a.name}" in MODULES else src for a in node.names]
        else:
            continue
        here = lines[node.lineno - 1]
        above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
        commented = "#" in here or above.startswith("#")
        for t in dict.fromkeys(targets):
            out.append(Import(module, t, node.lineno, id(node) in in_function, commented))
    return out


IMPORTS = {m: _imports(m) for m in MODULES}


def _package(module: str) -> str:
    return "dpx" if module in BOTTOM else module.split(".")[1]


def _dpx_edges(skip: set[tuple[str, str]] = frozenset()) -> dict[str, set[str]]:
    """module -> the dpx modules importing it executes: the target, and its packages' __init__ (except the
    importer's own packages, which are already running)."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for m, imps in IMPORTS.items():
        for imp in imps:
            if (m, imp.target) in skip:
                continue
            parts = imp.target.split(".")
            for k in range(2, len(parts) + 1):
                t = ".".join(parts[:k])
                if t in MODULES and t != m and not m.startswith(t + "."):
                    graph[m].add(t)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_sources_found():
    assert {"dpx.rundir", "dpx.orchestrator.cli", f"{TRIAL}.runner", "dpx.registry", "dpx.tasks", "dpx.models",
            "dpx.kernels"} <= set(MODULES)


def test_no_import_cycles():
    stale = sorted(e for e in KNOWN_CYCLE_EDGES
                   if not any(e[0] in c for c in _cycles(_dpx_edges(KNOWN_CYCLE_EDGES - {e}))))
    assert not stale, f"KNOWN_CYCLE_EDGES: {stale} no longer close an import cycle; remove them"
    cycles = _cycles(_dpx_edges(KNOWN_CYCLE_EDGES))
    assert not cycles, "import cycles between modules:\n" + "\n".join(
        " <-> ".join(c) + "\n    " + "\n    ".join(repr(i) for m in c for i in IMPORTS[m] if i.target in c)
        for c in cycles)


def test_no_upward_imports():
    bad = []
    for m, imps in IMPORTS.items():
        for imp in imps:
            if not (imp.target == "dpx" or imp.target.startswith("dpx.")):
                continue
            target = next((t for t in (imp.target, imp.target.rsplit(".", 1)[0]) if t in MODULES), None)
            if target is None:
                continue
            if _package(target) == "dpx" and target not in BOTTOM:
                continue
            if _package(target) not in MAY_IMPORT[_package(m)]:
                bad.append(f"{imp} ({_package(m)} may import only {sorted(MAY_IMPORT[_package(m)])})")
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_trial_side_imports_no_control_side():
    """orchestrator/trial/ runs in the trial's process on any node: stdlib, torch, dpx.tasks, dpx.rundir only."""
    bad = []
    for m, imps in IMPORTS.items():
        if not (m == TRIAL or m.startswith(TRIAL + ".")):
            continue
        for imp in imps:
            top = imp.target.split(".")[0]
            if top in TRIAL_FORBIDDEN:
                bad.append(f"{imp}: {top} is for the control side")
            elif imp.target.startswith("dpx.orchestrator") and not (
                    imp.target == TRIAL or imp.target.startswith(TRIAL + ".")):
                bad.append(f"{imp}: the control side")
    assert not bad, "\n".join(bad)


def test_lazy_imports_say_why():
    """An import inside a function only keeps a heavy dependency (torch, mlflow, ray, duckdb, pandas, matplotlib,
    submitit, the recipe loader's pydantic/omegaconf/hydra) off a path that must not load it, and says so."""
    bad = [repr(i) for m, imps in IMPORTS.items() if _package(m) in LAZY_COMMENTED
           for i in imps if i.lazy and not i.commented and i.target != "__future__"]
    assert not bad, "imports inside functions without a comment naming the dependency they keep lazy:\n" + \
        "\n".join(sorted(set(bad)))


@pytest.mark.parametrize("module,heavy", [
    ("dpx.models", ("torch", "mlflow", "ray")),
    ("dpx.tasks", ("torch", "mlflow", "ray")),
    ("dpx.registry", ("torch", "mlflow", "ray")),
    ("dpx.orchestrator.trial.runner", ("torch", "pydantic", "mlflow", "ray", "omegaconf", "duckdb")),
    ("dpx.orchestrator.cli", ("torch", "mlflow", "ray", "duckdb", "pandas", "matplotlib", "submitit", "pydantic",
                              "omegaconf")),
])
def test_cheap_imports_stay_cheap(module, heavy):
    code = f"import json, sys, {module}; print(json.dumps([m for m in {list(heavy)!r} if m in sys.modules]))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout.strip().splitlines()[-1]) == [], f"`import {module}` loaded {p.stdout.strip()}"
