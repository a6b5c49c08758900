"""`dpx logs`: a trial's log (every attempt) with its training lines, rendered from metrics.jsonl
(`[train] step 100  train/loss 0.5321  train/lr 0.001`), once or followed while the trial runs."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from dpx.rundir import LOG, METRICS


class TrialLog:
    """Reads log.txt and metrics.jsonl incrementally (complete lines only)."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.offsets = {LOG: 0, METRICS: 0}
        self.partial_step: tuple[int, dict] | None = None

    def _read(self, name: str) -> list[str]:
        path = self.run_dir / name
        try:
            with open(path, "rb") as f:
                f.seek(self.offsets[name])
                data = f.read()
        except OSError:
            return []
        end = data.rfind(b"\n")
        if end < 0:
            return []
        self.offsets[name] += end + 1
        return data[: end + 1].decode("utf-8", "replace").splitlines()

    def new_lines(self, final: bool = False) -> list[str]:
        out = self._read(LOG)
        steps: dict[int, dict] = {}
        if self.partial_step:
            steps[self.partial_step[0]] = self.partial_step[1]
        for line in self._read(METRICS):
            try:
                m = json.loads(line)
            except ValueError:
                continue  # a torn line of a killed trial
            if m.get("kind", "scalar") != "scalar":
                continue
            steps.setdefault(int(m.get("step") or 0), {})[m.get("key")] = m.get("value")
        order = sorted(steps)
        # the last step may still be getting keys: hold it back until a later step (or the end) shows up
        self.partial_step = None
        if order and not final:
            last = order.pop()
            self.partial_step = (last, steps[last])
        for s in order:
            vals = "  ".join(f"{k} {_fmt(v)}" for k, v in steps[s].items())
            out.append(f"[train] step {s}  {vals}")
        return out


def _fmt(v) -> str:
    if v is None:
        return "nan"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def show(run_dir: Path, tail: int = 0) -> list[str]:
    lines = TrialLog(run_dir).new_lines(final=True)
    return lines[-tail:] if tail else lines


def follow(run_dir: Path, still_running, poll_s: float = 0.5, write=None) -> None:
    """Print new lines until `still_running()` is False (then the rest). Ctrl-C stops."""
    write = write or (lambda s: (sys.stdout.write(s + "\n"), sys.stdout.flush()))
    log = TrialLog(run_dir)
    try:
        while True:
            running = still_running()
            for line in log.new_lines(final=not running):
                write(line)
            if not running:
                return
            time.sleep(poll_s)
    except KeyboardInterrupt:
        return
