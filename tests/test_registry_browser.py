"""Real browser checks (headless Chromium, Debian's `chromium`; .ci/services installs it):
- the HTML report opens with its comparison tables and every embedded figure decoded;
- the MLflow UI served by a real `mlflow server` lists a submission's parent run and, once the parent is expanded
  in the page (clicked through the DevTools protocol), its child trial runs.
Screenshots land in test-artifacts/ (gitignored)."""
from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from dpx.registry import report
from test_registry_report import build_demo

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium)")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]


def _chromium(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as prof:
        return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={prof}", *args], capture_output=True, text=True,
                              timeout=timeout)


@needs_chromium
def test_report_renders_in_chromium(tmp_path):
    db = build_demo(tmp_path)
    out = report(db, "demo", tmp_path / "demo.html")
    url = out.resolve().as_uri()
    dom = _chromium("--virtual-time-budget=10000", "--dump-dom", url).stdout
    ids = set(re.findall(r'<table[^>]* id="([^"]+)"', dom))
    assert {"cmp-table3", "cmp-fig5", "cmp-fig4", "cmp-fig8", "cmp-fig9", "trials", "failed"} <= ids
    n_imgs = len(re.findall(r"<img ", dom))
    ok = re.search(r'data-images-ok="(\d+)"', dom)
    assert ok, "the page's load handler did not run"
    assert int(ok.group(1)) == n_imgs == 6  # every figure decoded by the browser (4 plots + 2 trial figures)
    assert int(re.search(r'data-tables="(\d+)"', dom).group(1)) == len(re.findall(r"<table", dom))
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "registry_report.png"
    _chromium("--virtual-time-budget=10000", "--window-size=1400,2600", f"--screenshot={shot}", url)
    assert shot.read_bytes().startswith(b"\x89PNG") and shot.stat().st_size > 50_000


# ---- a minimal DevTools-protocol client (stdlib websocket), enough to click a button and read the page --------
class DevTools:
    def __init__(self, ws_url: str):
        m = re.match(r"ws://([^:/]+):(\d+)(/.*)", ws_url)
        self.sock = socket.create_connection((m.group(1), int(m.group(2))), timeout=60)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {m.group(3)} HTTP/1.1\r\nHost: {m.group(1)}:{m.group(2)}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
                          .encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.sock.recv(1)
        assert b" 101 " in head.split(b"\r\n")[0], head
        self.next_id = 0

    def _recv_exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("devtools socket closed")
            buf += chunk
        return buf

    def _recv_message(self) -> str:
        data = b""
        while True:
            b0, b1 = self._recv_exact(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._recv_exact(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._recv_exact(8))[0]
            data += self._recv_exact(n)
            if b0 & 0x80:  # FIN
                return data.decode()

    def call(self, method: str, **params):
        self.next_id += 1
        payload = json.dumps({"id": self.next_id, "method": method, "params": params}).encode()
        mask = os.urandom(4)
        n = len(payload)
        head = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack(">H", n)
                                if n < 65536 else bytes([0x80 | 127]) + struct.pack(">Q", n))
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))
        while True:
            msg = json.loads(self._recv_message())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    def js(self, expr: str):
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        return r["result"].get("value")

    def wait_for(self, expr: str, timeout: float = 60) -> None:
        end = time.time() + timeout
        while time.time() < end:
            if self.js(expr):
                return
            time.sleep(0.5)
        raise TimeoutError(f"page never satisfied: {expr}")

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, timeout: float, proc: subprocess.Popen) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(url)


def _stop(proc: subprocess.Popen) -> None:
    """Stop a process group we started: TERM (twice: mlflow server sometimes ignores the first), then KILL."""
    for sig in (signal.SIGTERM, signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


@pytest.mark.slow
@needs_chromium
def test_mlflow_ui_lists_parent_and_child_runs(tmp_path):
    from mlflow import MlflowClient

    port = _free_port()
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true",
           "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    mlflow_bin = Path(sys.executable).with_name("mlflow")
    server = subprocess.Popen([str(mlflow_bin), "server", "--workers", "1", "--host", "127.0.0.1", "--port",
                               str(port), "--backend-store-uri", f"sqlite:///{tmp_path}/mlflow.db",
                               "--default-artifact-root", str(tmp_path / "artifacts")],
                              env=env, cwd=tmp_path, stdout=open(tmp_path / "server.log", "w"),
                              stderr=subprocess.STDOUT, start_new_session=True)
    browser = None
    try:
        uri = f"http://127.0.0.1:{port}"
        _wait_http(f"{uri}/health", 240, server)
        # a submission as the orchestrator logs it (dpx's own Tracker): one parent run, one child run per trial
        from dpx.orchestrator.tracking import Tracker

        recipe = tmp_path / "demo.yaml"
        recipe.write_text('name: demo\ndescription: "demo sweep for the UI check"\ntask: {name: debug}\n')
        tracker = Tracker(uri)
        exp = tracker.experiment("registry_ui_check")
        parent_id = tracker.parent_run(exp, "submission-demo", "demo", str(recipe), 3)
        children = []
        for i in range(3):
            run_dir = tmp_path / f"t{i}"
            run_dir.mkdir()
            (run_dir / "metrics.jsonl").write_text(json.dumps({"key": "loss", "value": 1.0 / (i + 1), "step": 0,
                                                               "time": time.time(), "kind": "scalar"}) + "\n")
            point = {"model.num_householder": i + 1, "model.allow_neg_eigval": True, "seed": 0}
            row = {"recipe": "demo", "trial_id": f"t{i}", "config": {"seed": 0, "task": {"name": "debug"}},
                   "run_dir": str(run_dir), "status": "completed", "error": None, "point": json.dumps(point),
                   "mlflow_run_id": None, "mlflow_offset": 0, "started_at": time.time(), "ended_at": time.time()}
            tracker.sync_trial(exp, parent_id, row, final=True)
            children.append(f"n_h={i + 1} β∈[0,2] seed=0")
        tracker.end_parent(parent_id, "FINISHED")
        client = tracker.client
        assert client.get_experiment(exp).tags["mlflow.experimentKind"] == "custom_model_development"

        prof = tmp_path / "chrome-profile"
        browser = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={prof}", "--remote-debugging-port=0",
                                    "--window-size=1400,900", "about:blank"], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, start_new_session=True)
        port_file = prof / "DevToolsActivePort"
        end = time.time() + 60
        while not port_file.exists() or not port_file.read_text().strip():
            assert time.time() < end and browser.poll() is None, "chromium did not open its DevTools port"
            time.sleep(0.2)
        dt_port = int(port_file.read_text().split()[0])
        _wait_http(f"http://127.0.0.1:{dt_port}/json/version", 30, browser)
        pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{dt_port}/json/list"))
        page = DevTools(next(p for p in pages if p["type"] == "page")["webSocketDebuggerUrl"])
        page.call("Page.enable")
        # the experiment's address as dpx prints it (`dpx ui`): it must open on the runs table (a model training
        # experiment), not on MLflow 3's GenAI view (traces, "Detect Issues", an assistant), in a fresh browser
        from dpx.orchestrator.tracking import ui_url

        page.call("Page.navigate", url=ui_url(uri, exp))
        ARTIFACTS.mkdir(exist_ok=True)
        try:
            page.wait_for("document.body && document.body.innerText.includes('submission-demo')", 90)
        except TimeoutError:
            page.screenshot(ARTIFACTS / "mlflow_experiment_landing.png")
            raise AssertionError(f"{page.js('location.hash')}: {page.js('document.body.innerText')[:1500]}")
        page.screenshot(ARTIFACTS / "mlflow_runs_collapsed.png")
        text = page.js("document.body.innerText")
        assert "Detect Issues" not in text and "Model registry" in text, text[:2000]
        assert "/runs" in page.js("location.hash") and "genai" not in page.js("location.hash")
        # children are nested under the parent: click the parent's expand button in its run-name cell
        clicked = page.js("""(() => {
            const link = [...document.querySelectorAll('a')].find(a => a.textContent.trim() === 'demo/submission-demo');
            const cell = link && link.closest('[role=gridcell]');
            const btn = cell && cell.querySelector('button');
            if (!btn) return false; btn.click(); return true; })()""")
        assert clicked, "no expand button next to the parent run"
        names = json.dumps(children)
        page.wait_for(f"{names}.every(n => document.body.innerText.includes(n))", 60)
        page.screenshot(ARTIFACTS / "mlflow_runs_expanded.png")
        listed = page.js("[...document.querySelectorAll('[role=row]')].map(r => r.innerText).join('\\n')")
        for name in ["demo/submission-demo", *children]:
            assert name in listed
        # the child rows are nested: they come after the parent row in the grid
        assert listed.index("demo/submission-demo") < min(listed.index(c) for c in children)
        # the recipe's description is the experiment's description
        page.wait_for("document.body && document.body.innerText.includes('demo sweep for the UI check')", 60)
    finally:
        if browser is not None:
            _stop(browser)
        _stop(server)
