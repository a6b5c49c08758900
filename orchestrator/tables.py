"""The CLI's tables: `dpx submit --wait` / `dpx watch` results and `dpx status`. Reads the state store and the run
dirs; `dpx status` first settles what dead drivers left running (driver/adoption.py)."""
from __future__ import annotations

import json
from pathlib import Path

from rich.markup import escape  # errors carry log tails ("[dpx] ...", "[/x]"): text, not markup
from rich.table import Table

from dpx.rundir import PREFERRED, RESULT, read_json

from .driver.adoption import refresh_orphans
from .driver.liveness import driver_alive
from .grid import get_dotted
from .state import StateStore


def _summary(run_dir: str) -> dict:
    res = read_json(Path(run_dir) / RESULT) or {}
    return {k: v for k, v in (res.get("metrics") or {}).items() if isinstance(v, (int, float, str))}


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def print_results(ws, store: StateStore, recipe: str, sub_id: str, axes: list[str], console) -> None:
    rows = store.trials(submission=sub_id)
    sums = {r["trial_id"]: _summary(ws.run_dir(r["recipe"], r["trial_id"])) for r in rows}
    keys: list[str] = []
    for s in sums.values():
        for k, v in s.items():
            if k not in keys and isinstance(v, (int, float)):
                keys.append(k)
    keys.sort(key=lambda k: (PREFERRED.index(k) if k in PREFERRED else len(PREFERRED), k))
    keys = keys[:6]
    t = Table(title=f"{recipe}: results")
    t.add_column("trial_id")
    for a in axes:
        t.add_column(a.split(".")[-1])
    t.add_column("status")
    for k in keys:
        t.add_column(k, justify="right")
    for r in rows:
        cfg = json.loads(r["config"])
        style = {"completed": "green", "failed": "red"}.get(r["status"], "yellow")
        t.add_row(r["trial_id"], *[_fmt(cfg["seed"] if a == "seed" else get_dotted(cfg, a)) for a in axes], f"[{style}]{r['status']}[/{style}]",
                  *[_fmt(sums[r["trial_id"]].get(k, "")) for k in keys])
    console.print(t)
    for r in rows:
        if r["status"] == "failed":
            console.print(f"[red]{r['trial_id']}[/red] failed: {escape(r['error'] or '')}  (dpx logs {r['trial_id']})",
                          highlight=False, soft_wrap=True)


def print_status(ws, store: StateStore, recipe: str | None, console, all_trials: bool = False) -> None:
    settled, backend_notes = refresh_orphans(store, recipe)  # no live driver: ask the backend (local pid, sacct)
    recipes = [recipe] if recipe else store.recipes()
    t = Table(title=f"dpx status ({escape(str(ws.root))})")
    for col in ("recipe", "total", "completed", "running", "pending", "failed", "cancelled", "driver"):
        t.add_column(col, justify="right" if col not in ("recipe", "driver") else "left")
    notes = []
    for name in recipes:
        c = store.counts(recipe=name)
        subs = store.submissions(name)
        live = [s for s in subs if driver_alive(s)]
        drv = f"running ({live[-1]['id']})" if live else (subs[-1]["state"] if subs else "-")
        t.add_row(name, str(sum(c.values())), f"[green]{c['completed']}[/green]", f"[cyan]{c['running']}[/cyan]",
                  f"[yellow]{c['pending']}[/yellow]", f"[red]{c['failed']}[/red]", str(c["cancelled"]), drv)
        if not live and (c["pending"] or c["running"]):
            notes.append(f"{name}: no live driver but {c['pending']} pending / {c['running']} running trial(s); "
                         f"`dpx submit` the recipe again to resume (finished trials will not run again)")
    console.print(t)
    for name in recipes:
        for r in store.trials(recipe=name, status="failed"):
            console.print(f"[red]failed[/red] {name}/{r['trial_id']} (attempts {r['attempts']}): {escape(r['error'] or '')}",
                          highlight=False, soft_wrap=True)
        if all_trials:
            for r in store.trials(recipe=name):
                console.print(f"{r['status']:>9} {name}/{r['trial_id']} attempts={r['attempts']} {r['point']}",
                              highlight=False)
    if settled:
        notes.insert(0, f"{settled} trial(s) of a dead driver settled from the backend and their run dirs")
    for n in backend_notes + notes:
        console.print(f"[yellow]note:[/yellow] {escape(n)}", highlight=False)
