"""`dpx server`: an MLflow tracking server for clusters, so drivers and workers on other nodes log by URI.

Lean on purpose (the research measured 9.9 s and 2.3 GiB for MLflow's defaults, 3.8 s and 0.4 GiB lean): one
uvicorn worker, no job runner or huey consumers, no telemetry. The store is SQL: SQLite by default (the
workspace's own mlflow.db, so `dpx ui` and the server show the same runs), or a PostgreSQL URI. Artifacts are
served by the server (`--artifacts-destination`): clients upload over HTTP, no shared filesystem needed.
Recipes point at it with `tracking.mlflow_uri: http://HOST:PORT`, or the environment with DPX_MLFLOW_URI.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

LEAN_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true",
            "GIT_PYTHON_REFRESH": "quiet"}
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def check_store(uri: str) -> None:
    """Raise ValueError (one line) for a store URI this machine cannot serve."""
    scheme = uri.split(":", 1)[0].split("+", 1)[0]
    if scheme in ("file", "") or "://" not in uri:
        raise ValueError(f"{uri}: use a SQL store (sqlite:///path/mlflow.db or postgresql://user@host/db); "
                         "MLflow's file store is retired")
    if scheme not in ("sqlite", "postgresql", "mysql", "mssql"):
        raise ValueError(f"{uri}: unsupported store {scheme!r} (sqlite or postgresql)")
    try:  # the driver SQLAlchemy will load for this URI (postgresql:// means psycopg 3 since SQLAlchemy 2.1)
        from sqlalchemy.engine import make_url  # sqlalchemy (with mlflow): only for a database URI

        make_url(uri).get_dialect().import_dbapi()
    except ImportError as e:
        pkg = {"psycopg": "psycopg[binary]", "psycopg2": "psycopg2-binary"}.get(e.name or "", e.name)
        raise ValueError(f"{uri}: the server host needs the `{e.name}` driver (pip install {pkg})") from None
    except Exception as e:  # noqa: BLE001 — unknown dialect/driver name, malformed URI
        raise ValueError(f"{uri}: {str(e).splitlines()[0][:200]}") from None


def public_uri(host: str, port: int) -> str:
    """The URI other nodes use: the machine's name when the server listens on every interface."""
    name = socket.getfqdn() if host in ("0.0.0.0", "::", "") else host
    return f"http://{name}:{port}"


def server_command(store: str, artifacts: str, host: str, port: int, allowed_hosts: str | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", store, "--artifacts-destination",
           artifacts, "--host", host, "--port", str(port), "--workers", "1"]
    if allowed_hosts is None and host not in LOOPBACK:
        # MLflow's default admits localhost and private IPs only; cluster nodes often call the host by name
        names = {socket.gethostname(), socket.getfqdn(), "localhost", "127.0.0.1"}
        allowed_hosts = ",".join(sorted(names | {f"{n}:{port}" for n in names} | {"10.*", "172.*", "192.168.*"}))
    if allowed_hosts:
        cmd += ["--allowed-hosts", allowed_hosts]
    return cmd


def start(store: str, artifacts: str | Path, host: str = "127.0.0.1", port: int = 5000, log: Path | None = None,
          allowed_hosts: str | None = None) -> subprocess.Popen:
    """Start `mlflow server` in its own process group (so stop() reaches its workers too)."""
    check_store(store)
    art = str(artifacts)
    if "://" not in art and ":" not in art.split("/")[0]:
        Path(art).mkdir(parents=True, exist_ok=True)
        art = Path(art).absolute().as_uri()
    if store.startswith("sqlite:///"):
        Path(store[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    out = open(log, "ab") if log else subprocess.DEVNULL
    try:
        return subprocess.Popen(server_command(store, art, host, port, allowed_hosts), stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, **LEAN_ENV})
    finally:
        if log:
            out.close()


def wait_healthy(uri: str, proc: subprocess.Popen | None = None, timeout: float = 180) -> float:
    """Seconds until GET /health answers 200; raises RuntimeError if the server exits or never answers."""
    t0 = time.time()
    url = uri.replace("://0.0.0.0", "://127.0.0.1").rstrip("/") + "/health"
    while time.time() - t0 < timeout:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return time.time() - t0
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"mlflow server at {uri} did not answer /health within {timeout:.0f}s")


def stop(pid: int, grace: float = 15) -> None:
    """TERM the server's process group, TERM again (a first TERM sometimes leaves the main process up), KILL."""
    for sig in (signal.SIGTERM, signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.time() + grace / 2
        while time.time() < deadline:
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                return
            try:  # reap it when it is our child, so it does not linger as a zombie
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    pass
            except ChildProcessError:
                pass
            time.sleep(0.2)


def state_file(ws) -> Path:
    return Path(ws.root) / "server.json"


def read_state(ws) -> dict | None:
    try:
        return json.loads(state_file(ws).read_text())
    except (OSError, ValueError):
        return None
