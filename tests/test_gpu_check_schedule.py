"""benchmarks/gpu_check_schedule.py: the acceptance check's order and packing, with a stand-in for a case's
process (a function that records when it ran): one case of each compile group first, the others of a group only
after it, memory estimates packed per GPU without a small case overtaking a large one."""
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from gpu_check_schedule import compile_group, schedule  # noqa: E402


def _case(i, group, gib=1.0, s=0.02):
    return {"id": f"c{i}", "kind": "chunk", "dtype": "bfloat16", "n": group, "K": 64, "V": 64, "gate": "none",
            "gib": gib, "s": s}


class Recorder:
    """run(c, gpu): sleeps c['s'], and records start/end times and the memory in use on its GPU at each start."""
    def __init__(self):
        self.lock, self.events, self.live = threading.Lock(), {}, {}

    def __call__(self, c, gpu):
        with self.lock:
            self.live[c["id"]] = (gpu, c["gib"])
            in_use = sum(g for gg, g in self.live.values() if gg == gpu)
            self.events[c["id"]] = {"start": time.monotonic(), "gpu": gpu, "in_use": in_use}
        time.sleep(c["s"])
        with self.lock:
            del self.live[c["id"]]
            self.events[c["id"]]["end"] = time.monotonic()
        return {"id": c["id"]}


def test_every_case_runs_once_and_a_groups_first_case_runs_before_the_rest():
    cases = [_case(i, i % 3) for i in range(12)]
    rec = Recorder()
    got = [r["id"] for r in schedule(cases, 4, rec)]
    assert sorted(got) == sorted(c["id"] for c in cases)
    ev = rec.events
    for g in range(3):
        members = [c["id"] for c in cases if c["n"] == g]
        lead, rest = members[0], members[1:]
        assert all(ev[r]["start"] >= ev[lead]["end"] for r in rest)  # they read the leader's compiled kernels


def test_memory_estimates_are_packed_and_no_gpu_is_overfilled():
    cases = [_case(i, i, gib=g) for i, g in enumerate([8, 8, 8, 1, 1, 1, 1, 1, 1, 8, 1, 1])]
    rec = Recorder()
    list(schedule(cases, 16, rec, {"0": 18.0, "1": 18.0}, est=lambda c: c["gib"]))
    assert max(e["in_use"] for e in rec.events.values()) <= 18.0
    assert {e["gpu"] for e in rec.events.values()} == {"0", "1"}
    # 16 jobs, but the memory held it to fewer cases at a time than jobs
    starts = sorted((e["start"], e["end"]) for e in rec.events.values())
    peak = max(sum(s <= t < e for s, e in starts) for t, _ in starts)
    assert 2 < peak < 12


def test_a_small_case_passes_a_large_one_waiting_for_room_and_the_large_one_runs_when_room_frees():
    # c0 (6 GiB) runs; c1 (8 GiB) does not fit beside it in 10 GiB and waits; c2 (1 GiB) fits and starts beside c0
    cases = [_case(0, 0, 6, s=0.2), _case(1, 1, 8, s=0.05), _case(2, 2, 1, s=0.05)]
    rec = Recorder()
    list(schedule(cases, 3, rec, {None: 10.0}, est=lambda c: c["gib"]))
    ev = rec.events
    assert ev["c2"]["start"] < ev["c0"]["end"] <= ev["c1"]["start"]
    assert max(e["in_use"] for e in ev.values()) <= 10.0


def test_a_case_larger_than_the_gpu_runs_alone():
    cases = [_case(0, 0, 50), _case(1, 1, 1), _case(2, 2, 1)]
    rec = Recorder()
    assert len(list(schedule(cases, 3, rec, {None: 10.0}, est=lambda c: c["gib"]))) == 3
    assert rec.events["c0"]["in_use"] == 50


def test_an_exception_in_run_reaches_the_caller():
    def run(c, gpu):
        if c["id"] == "c1":
            raise ValueError("bug in the runner")
        return c
    with pytest.raises(ValueError, match="bug in the runner"):
        list(schedule([_case(i, i) for i in range(4)], 2, run))


def test_compile_groups_follow_what_triton_specializes_on():
    a = _case(0, 2)
    assert compile_group(a) == compile_group(dict(a, id="x", B=512, T=33, H=12))  # grid and runtime args only
    assert compile_group(a) != compile_group(dict(a, gate="rand"))                # USE_G
    assert compile_group(a) != compile_group(dict(a, dtype="float16"))
    assert compile_group(a) != compile_group(dict(a, K=128, V=128))
