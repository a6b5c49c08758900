"""One driver per recipe and workspace.

A second `dpx submit` (or `rerun`) of a recipe whose driver is alive hands its new trials to that driver (they join
its queue, within its `max_parallel`) and starts a driver of its own that waits its turn: it runs only once every
earlier driver of the recipe has ended, and then only what is still pending (nothing, usually). So two submissions
never run trials of one recipe side by side, `max_parallel` holds, and a driver that ends just as trials are handed
over leaves nothing behind.
"""
from __future__ import annotations

import time

from .liveness import driver_alive

POLL_S = 1.0
SPAWN_GRACE_S = 15.0  # a submission registered this recently without a driver pid yet: its CLI is spawning one


def earlier_live(store, sub_id: str) -> dict | None:
    """The earliest live submission of `sub_id`'s recipe that was created before it, or None. One whose CLI is
    still starting its driver counts as live (two submits at the same moment: the later one waits)."""
    me = store.submission(sub_id)
    if me is None:
        return None
    for s in store.submissions(me["recipe"]):
        if s["id"] == sub_id:
            return None
        spawning = (s["state"] == "starting" and not s["driver_pid"]
                    and time.time() - (s["created_at"] or 0) < SPAWN_GRACE_S)
        if driver_alive(s) or spawning:
            return dict(s)
    return None


def live_driver(store, recipe: str, exclude: str | None = None) -> dict | None:
    for s in store.submissions(recipe):
        if s["id"] != exclude and driver_alive(s):
            return dict(s)
    return None


def hand_over(store, from_sub: str, to_sub: str) -> int:
    """Put `from_sub`'s pending trials into `to_sub`'s queue (after its own); returns how many were added."""
    return store.hand_over(from_sub, to_sub)


def wait_turn(store, sub_id: str, log=print) -> bool:
    """Block while an earlier driver of the recipe is alive (heartbeating meanwhile). False: cancelled while
    waiting."""
    said = None
    while True:
        first = earlier_live(store, sub_id)
        me = store.submission(sub_id)
        if me is not None and me["state"] == "cancelling":
            return False
        if first is None:
            return True
        if said != first["id"]:
            log(f"[driver] waiting for the live driver of {first['recipe']} (submission {first['id']}, pid "
                f"{first['driver_pid']}); its queue has this submission's new trials", flush=True)
            said = first["id"]
        store.update_submission(sub_id, heartbeat=time.time())
        time.sleep(POLL_S)


def cancel_waiting(store, sub_id: str) -> None:
    """A waiting driver cancelled before its turn: its pending trials are cancelled, it ends `cancelled`."""
    sub = store.submission(sub_id)
    store.cancel_pending(sub["recipe"], submission=sub_id)
    store.update_submission(sub_id, state="cancelled", ended_at=time.time())


def finish_if_nothing_left(store, sub_id: str) -> bool:
    """After its wait: a submission whose trials the earlier driver all ran ends `done` here, without a driver of
    its own (no empty MLflow parent run, no fork server). True when it did. Trials still `running` (an earlier
    driver died with them) need a driver to adopt them: False then."""
    return store.finish_if_nothing_left(sub_id)
