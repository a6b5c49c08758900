"""Package layout: the repo's top-level folders install as subpackages of one distribution, `dpx`.

`orchestrator/` -> `dpx.orchestrator`, `kernels/` -> `dpx.kernels`, ... so nothing named `models` or `tasks`
lands at the top of site-packages. `dpx` itself is the small package in `dpx/` (`__version__` and the Python API,
`dpx.submit`, `dpx.results`, ...: orchestrator/api.py). Everything else about the
project (dependencies, scripts) lives in pyproject.toml; this file only computes the package list so that new
subfolders need no edit here.
"""
from setuptools import find_packages, setup

ROOTS = ["orchestrator", "kernels", "models", "tasks", "registry"]

packages, package_dir = ["dpx"], {"dpx": "dpx"}
for root in ROOTS:
    package_dir[f"dpx.{root}"] = root
    packages += [f"dpx.{p}" for p in find_packages(where=".", include=[root, f"{root}.*"])]

setup(
    packages=packages,
    package_dir=package_dir,
    package_data={p: ["*.csv", "*.json", "*.yaml", "*.txt", "*.jsonl", "*.model", "*.html", "data/*"] for p in packages},
    include_package_data=True,
)
