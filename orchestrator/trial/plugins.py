"""Tasks from other packages, through entry points: a user package adds a task without editing dpx.

In the user package's pyproject.toml:

    [project.entry-points."dpx.tasks"]
    my_task = "my_pkg.dpx_tasks:my_task"

where `my_pkg/dpx_tasks.py` (keep it torch-free: recipes are validated without torch) holds

    my_task = {"config": "my_pkg.config:MyTaskConfig",   # a stdlib dataclass, as dpx's own task configs
               "run": "my_pkg.task:run",                 # run(config: dict, ctx: RunContext) -> dict
               "doc": "what it measures",
               "needs_model": True}                      # False: the recipe needs no `model:` section

`load()` registers each into `dpx.tasks.TASKS` (a built-in name is never replaced); the recipe loader and the trial
runner call it, so `task: {name: my_task}` works in recipes, `dpx expand` and trials alike. It lives on the trial
side (stdlib + dpx.tasks) because the runner loads it in the trial's process; the control side imports it too.
"""
from __future__ import annotations

import sys
from importlib.metadata import entry_points

from dpx.tasks import TASKS, TaskSpec, register

GROUP = "dpx.tasks"
NO_MODEL: set[str] = set()  # plugin tasks that train no model (like the built-in `debug`)
_loaded = False


def load(force: bool = False) -> list[str]:
    """Register the entry-point tasks; returns their names. A broken plugin is a warning, not a failure."""
    global _loaded
    if _loaded and not force:
        return []
    _loaded = True
    added = []
    for ep in entry_points(group=GROUP):
        if ep.name in TASKS and TASKS[ep.name].run.startswith("dpx."):
            print(f"dpx: warning: task plugin {ep.name!r} ({ep.value}) ignored: a built-in task has that name",
                  file=sys.stderr)
            continue
        try:
            spec = ep.load()
            if isinstance(spec, TaskSpec):
                spec = {"config": spec.config, "run": spec.run, "doc": spec.doc}
            register(ep.name, spec["config"], spec["run"], spec.get("doc", ""))
            if spec.get("needs_model", True) is False:
                NO_MODEL.add(ep.name)
            added.append(ep.name)
        except Exception as e:  # noqa: BLE001
            print(f"dpx: warning: task plugin {ep.name!r} ({ep.value}) not loaded: {type(e).__name__}: {e}",
                  file=sys.stderr)
    return added
