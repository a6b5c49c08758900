"""dpx orchestrator: recipe → trials → state store → backend → driver, and the `dpx` CLI. Two sides:

    trial/     runs in a trial's own process (stdlib + torch + dpx.tasks): the runner backends launch, the
               worker registration, the rank launcher, task plugins
    the rest   the control side (pydantic, omegaconf, mlflow, ray, duckdb, by need): the CLI (cli.py) and the
               Python API (api.py), the recipe loader (load.py, limits.py, grid.py, trials.py, identity.py, refs.py),
               the config sections (hardware.py, tracking_config.py), the state store (state.py, turns.py,
               rundir_state.py, repair.py), the driver process (driver/), the backends (backends/), MLflow
               (tracking.py, server.py), the CLI's tables and syncs (tables.py, sync.py, progress.py, logs.py,
               export.py)

The control side imports the trial side, never the other way (tests/test_layering.py). Kept import-free on
purpose: `python -m dpx.orchestrator.trial.runner` must run on a bare GPU node without the control side's packages.
"""
