"""dpx: declarative experiments for linear-RNN research.

    import dpx
    dpx.__version__
    ex = dpx.expand("recipes/quickstart.yaml", ["model.num_householder=1,2"])
    sub = dpx.submit("recipes/quickstart.yaml", ["seeds=[1]"])   # a handle: status(), wait(), cancel(), results()
    df = dpx.results("quickstart")                               # pandas DataFrame (or pass SQL)

The subpackages are `dpx.orchestrator`, `dpx.models`, `dpx.tasks`, `dpx.kernels`, `dpx.registry`. Importing `dpx`
is cheap: the API functions load their modules when called.
"""
from __future__ import annotations

from importlib import import_module

try:
    from importlib.metadata import PackageNotFoundError, version

    __version__ = version("dpx")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

_API = ("expand", "submit", "results", "status", "cancel", "Submission", "RecipeError")
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        return getattr(import_module("dpx.orchestrator.api"), name)
    raise AttributeError(f"module 'dpx' has no attribute {name!r}")
