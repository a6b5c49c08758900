"""benchmarks/kernel_configs.py (the per-config kernel timing sweep of the H200 runs): its plumbing on the CPU
interpreter (one process per kernel, the autotuned row, pinned candidates, the summary table), and the summary's
arithmetic on rows with known times."""
import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "kernel_configs.py"
sys.path.insert(0, str(SCRIPT.parent))
from dpx_checkout import load_script  # noqa: E402  (benchmarks/: a script by path)


def _module():
    return load_script(SCRIPT, "kernel_configs")


def test_summary_names_the_best_candidate_and_its_ratio():
    rows = [
        {"kernel": "wu", "n": 2, "gated": False, "config": "autotuned", "ms": 0.30, "picked": "BV=64 w4 s2"},
        {"kernel": "wu", "n": 2, "gated": False, "config": "BV=64 w4 s2", "ms": 0.30, "in_space": True},
        {"kernel": "wu", "n": 2, "gated": False, "config": "BV=128 w8 s2", "ms": 0.20, "in_space": False},
        {"kernel": "wu", "n": 2, "gated": False, "config": "BV=32 w8 s1", "error": "OutOfResources"},
        {"kernel": "fwd_h", "n": 2, "gated": False, "config": "autotuned", "error": "boom"},
    ]
    md = _module().summary(rows)
    line = next(x for x in md.splitlines() if x.startswith("| wu |"))
    assert "0.300 (BV=64 w4 s2)" in line and "BV=128 w8 s2 (new)" in line and "| 1.50 |" in line, line
    assert "| fwd_h |" not in md  # no timed candidate: no row


def test_cpu_interpreter_run(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--small", "--ns", "2", "--jobs", "2",
                        "--budget-s", "1", "--kernels", "wu,dqkwg,o_super"], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = [json.loads(x) for x in (tmp_path / "kernel_configs.jsonl").read_text().splitlines()]
    for key in [("wu", False), ("dqkwg", False), ("dqkwg", True), ("o_super", False)]:
        mine = [x for x in rows if (x["kernel"], x["gated"]) == key]
        assert any(x["config"] == "autotuned" and x["ms"] > 0 for x in mine), mine
        assert any(x["config"] != "autotuned" and "ms" in x for x in mine), mine  # at least one pinned candidate
        assert not [x for x in mine if "error" in x], mine
    md = (tmp_path / "kernel_configs.md").read_text()
    assert "| wu | 2 | False |" in md and "processes that did not exit cleanly: none" in md, md
