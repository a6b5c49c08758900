"""Helpers for benchmark scripts run from a checkout.

`load_script(path, name)`: another script as a module, by path. `expose_kernels()`: `dpx.kernels` for a checkout that
was never `pip install -e .`'d: the repository's kernels/ folder is registered as the package dpx.kernels (only it:
the kernel benchmarks import nothing else of dpx).

    try:
        from dpx.kernels import chunk_gated_delta_product
    except ImportError:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from dpx_checkout import expose_kernels
        expose_kernels()
        from dpx.kernels import chunk_gated_delta_product
"""
from __future__ import annotations

import importlib.util
import os
import sys
import types


def expose_kernels() -> None:
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    dpx = types.ModuleType("dpx")
    dpx.__path__ = []
    sys.modules["dpx"] = dpx
    spec = importlib.util.spec_from_file_location("dpx.kernels", os.path.join(root, "kernels", "__init__.py"),
                                                  submodule_search_locations=[os.path.join(root, "kernels")])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["dpx.kernels"] = mod
    dpx.kernels = mod  # `import dpx.kernels` binds the parent's attribute
    spec.loader.exec_module(mod)


def load_script(path, name: str) -> types.ModuleType:
    """The script at `path` as a module named `name`, by path and not through sys.path: `import kernels` could find
    the repository's kernels/ package instead of benchmarks/kernels.py. Not registered in sys.modules."""
    spec = importlib.util.spec_from_file_location(name, str(path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
