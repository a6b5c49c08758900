"""Fork server for the local backend (`python -m dpx.orchestrator.trial.forkserver`, started by backends/local.py):
one long-lived process with the trial code path (and torch) imported once,
which forks a child per trial attempt. Starting a trial then costs a fork (milliseconds) instead of a Python
start-up and a torch import (about a second), which is most of a short trial's cost.

Protocol (JSON lines): the driver writes {"id", "run_dir", "attempt", "env", "log"} on stdin; the server answers
{"id", "pid"} when the child is started and {"pid", "exit"} when it ended (exit < 0: killed by that signal).
Children run in their own session, so they outlive the server and the driver: a new driver adopts them by pid.
The parent never initialises CUDA or starts threads before forking (fork-safety); each child does its own.
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import sys
import traceback

from .runner import run_trial  # the trial code path, imported once in this process, never in the driver


def _child(req: dict) -> None:
    os.setsid()
    fd = os.open(req["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    nul = os.open(os.devnull, os.O_RDONLY)
    os.dup2(nul, 0)
    os.close(nul)
    os.environ.update(req.get("env") or {})
    os.chdir(req["run_dir"])
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    code = 1
    try:
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)

        code = run_trial(req["run_dir"], int(req["attempt"]))
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve() -> None:
    preload = os.environ.get("DPX_FORKSERVER_PRELOAD", "torch")
    if "torch" in preload.split(","):
        try:
            import torch  # noqa: F401  torch: preloaded when asked (the default) so forked trials skip its import; no CUDA init, no threads: fork-safe
        except ImportError:
            pass
    out = sys.stdout
    print(json.dumps({"ready": os.getpid()}), file=out, flush=True)
    sel = selectors.DefaultSelector()
    rfd, wfd = os.pipe()  # self-pipe: SIGCHLD wakes the loop
    os.set_blocking(wfd, False)
    signal.set_wakeup_fd(wfd)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel.register(0, selectors.EVENT_READ, "in")
    sel.register(rfd, selectors.EVENT_READ, "chld")
    stdin_open = True
    children: set[int] = set()
    buf = b""
    while stdin_open or children:
        for key, _ in sel.select(timeout=1.0):
            if key.data == "in":
                chunk = os.read(0, 65536)  # raw reads: a buffered readline could strand a second request
                if not chunk:  # the driver is gone: start nothing more, keep reaping our children
                    sel.unregister(0)
                    stdin_open = False
                    continue
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    req = json.loads(line)
                    pid = os.fork()
                    if pid == 0:
                        sel.close()
                        _child(req)
                    children.add(pid)
                    _send(out, {"id": req["id"], "pid": pid})
            else:
                try:
                    os.read(rfd, 4096)
                except BlockingIOError:
                    pass
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                children.clear()
                break
            if pid == 0:
                break
            children.discard(pid)
            code = os.waitstatus_to_exitcode(status)
            _send(out, {"pid": pid, "exit": code})


def _send(out, msg: dict) -> None:
    try:
        print(json.dumps(msg), file=out, flush=True)
    except (BrokenPipeError, OSError):
        pass  # driver gone; the run dir still tells how the trial ended


if __name__ == "__main__":
    serve()
