"""The driver: a detached process per submission (`python -m dpx.orchestrator.driver`) that runs its pending trials
on the backend until none is left, and the rules it shares with the CLI. One module a job:

    process.py    the process: spawn_driver (the CLI starts it), main (wait its turn, run, record a crash)
    turns.py      one driver per recipe: a later submission's trials join the live driver's queue
    loop.py       the main loop (Driver): claim and start trials, poll, settle, time out, cancel, forward to MLflow
    attempts.py   an attempt in its run dir: config written before it starts, its log header, its end, its log tail
    retry.py      settle: how an ended attempt ends its trial (completed / failed / requeued: the retry policy)
    liveness.py   whether a submission's driver is alive (driver_alive), whether its process has ended
    adoption.py   trials whose driver died: what their attempt is doing (local_attempt), settled from the backend
                  by `dpx status` / `dpx sync` (refresh_orphans) or adopted by the next driver (loop.py)
    parents.py    the MLflow parent run: its status (parent_status), closed by its driver or, after a driver
                  died, by the next driver or `dpx sync` (close_orphan_parents)

Control side: imports the trial side, the backends, the state store; never imported by the trial side.
Import-free itself (importing `dpx.orchestrator.driver.liveness` loads only what liveness needs).
"""
