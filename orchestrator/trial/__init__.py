"""The trial side of the orchestrator: what runs in a trial's own process, on any node (a bare GPU node included).

    runner.py    `python -m dpx.orchestrator.trial.runner RUN_DIR [--attempt N]`: the command every backend launches
    worker.py    the attempt registers itself in its run dir (worker.json); `pid_alive`, the one process check
    ranks.py     the rank launcher: a data-parallel trial re-runs the runner under torchrun, one process a rank
    plugins.py   tasks from other packages (entry points), registered into dpx.tasks.TASKS

Imports: the standard library, dpx.rundir, dpx.tasks (which loads torch only when a task needs it) and this
sub-package; never pydantic, omegaconf, mlflow, duckdb or ray, nor the control side (tests/test_layering.py checks).
Import-free itself, so that importing one module here loads only that module's imports.
"""
