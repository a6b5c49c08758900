"""Live progress of a submission (`dpx submit --wait`): counts, a bar, elapsed time, ETA, running trials."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from dpx.rundir import PROGRESS

from .driver.liveness import driver_alive


def _hms(s: float) -> str:
    s = int(max(0, s))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def _progress(run_dir: str) -> tuple[float, str]:
    try:
        p = json.loads((Path(run_dir) / PROGRESS).read_text())
        return float(p.get("fraction", 0)), str(p.get("message", ""))
    except (OSError, ValueError):
        return 0.0, ""


def render(store, sub_id: str, t0: float, recipe: str) -> tuple[Group, dict]:
    rows = store.trials(submission=sub_id)
    c = {s: 0 for s in ("pending", "running", "completed", "failed", "cancelled")}
    running_frac = 0.0
    running = []
    for r in rows:
        c[r["status"]] += 1
        if r["status"] == "running":
            f, msg = _progress(r["run_dir"])
            running_frac += f
            running.append((r["trial_id"], f, msg, r["attempts"]))
    total = len(rows)
    finished = c["completed"] + c["failed"] + c["cancelled"]
    elapsed = time.time() - t0
    done_units = finished + running_frac
    eta = elapsed / done_units * (total - done_units) if done_units > 0.05 else None
    head = Text.assemble(
        (f"{recipe} ", "bold"), ("done ", ""), (str(c["completed"]), "green"), ("  running ", ""),
        (str(c["running"]), "cyan"), ("  pending ", ""), (str(c["pending"]), "yellow"), ("  failed ", ""),
        (str(c["failed"]), "red"), (f"  cancelled {c['cancelled']}" if c["cancelled"] else "", ""),
        (f"   {finished}/{total}  elapsed {_hms(elapsed)}  ETA {_hms(eta) if eta is not None else '?'}", "dim"))
    bar = ProgressBar(total=max(total, 1), completed=done_units, width=60)
    t = Table(show_header=True, box=None, padding=(0, 1))
    t.add_column("running trial")
    t.add_column("progress", justify="right")
    t.add_column("")
    for tid, f, msg, att in running[:8]:
        t.add_row(tid + (f" (attempt {att})" if att > 1 else ""), f"{100 * f:3.0f}%", msg[:60])
    parts = [head, bar] + ([t] if running else [])
    return Group(*parts), c


def watch(ws, store, sub_id: str, ex) -> dict:
    """Block until the submission's trials are all finished (or its driver is gone with work left)."""
    t0 = time.time()
    console = Console()
    live = Live(console=console, refresh_per_second=4, transient=False) if console.is_terminal else None
    last_line = ""
    c: dict = {}
    try:
        if live:
            live.start()
        while True:
            group, c = render(store, sub_id, t0, ex.recipe)
            if live:
                live.update(group)
            else:  # not a terminal (CI, pipes): one line whenever the counts change
                line = (f"[{_hms(time.time() - t0)}] done {c['completed']} running {c['running']} pending "
                        f"{c['pending']} failed {c['failed']}")
                if line.split("] ", 1)[1] != last_line:
                    print(line, flush=True)
                    last_line = line.split("] ", 1)[1]
            if c["pending"] == 0 and c["running"] == 0:
                break
            sub = store.submission(sub_id)
            if sub["state"] in ("crashed",) or (sub["state"] not in ("starting",) and not driver_alive(sub)
                                                 and c["running"] == 0 and sub["state"] != "done"):
                print(f"driver of {sub_id} is gone ({sub['state']}); see {ws.drivers / (sub_id + '.log')}",
                      file=sys.stderr)
                break
            time.sleep(0.25)
    finally:
        if live:
            live.stop()
    return c
