"""The order and packing of the GPU acceptance check's cases (benchmarks/gpu_check.py): which case starts when.

The check is bound by the CPU, not the GPU: each case is a fresh process that compiles and autotunes every config
of every kernel it runs, and 16 such processes saturate the 16 cores of the device machine (session 18's H200 run
at 16 jobs summed twice the per-case wall time of session 23's H100 run at 9 jobs, for the same throughput). Two
things waste that CPU, and this module removes both:

- Compiling the same kernels twice. Cases that share a compile group (kind, dtype, n_h, head dims, gated or not:
  the same constexprs and dtypes, so the same binaries) compiled them side by side when they started together
  (session 23: four recipe cases of bf16 n_h 2 head dim 64 without a gate, 19-36 s of first-call time each). Here
  the first case of each group runs before the others of that group, which then read Triton's on-disk cache.
- Memory. A fixed job count sized for a largest case of 8.5 GiB ran an H100 at 9 jobs, while most cases need
  about 0.6 GiB and the largest need 24 (session 27 measured every case's peak: 9 of the largest together would
  not have fit an H200 either). Here each case has a memory estimate (its measured peak where an earlier run
  recorded one) and starts while the estimates of the running cases plus its own fit the GPU.

No torch here: the schedule is tested on the CPU with a stand-in for a case's process.
"""
from __future__ import annotations

import queue
import threading

CTX_GIB = 0.8          # a case process's CUDA context and Triton's loaded modules (outside torch's allocator)
ALLOC_FLOOR_GIB = 0.6  # the smallest cases' allocator peak (0.3-0.6 GiB: inputs, the autotuner's 256 MB L2 flush)
MEASURED_MARGIN = 1.15  # on a peak measured in an earlier run (the allocator's reservation varies a little)


def est_gib(c: dict, peaks: dict | None = None) -> float:
    """A case's GPU memory (GiB): its measured peak from an earlier run (`peaks`: {case id: the allocator's peak
    reservation, gpu_check rows' gpu_peak_gib}) with a margin, else an estimate from its shape, fitted to session
    27's H100 peaks (0.3-23.7 GiB, 193 cases) and above every one of them:
    - a floor of ALLOC_FLOOR_GIB, and on top of it
    - training (forward + backward, float64 reference): 220 B per element of [B, H, 64-step chunks, max(d, 64)]
      (the reference's intra-chunk [64, 64] matrices outgrow the [B, T*n, H, d] tensors at small head dims:
      512 x 33 at n_h 2, d 32 peaked at 7.0 GiB);
    - an evaluation forward at length T: 250 B x n_h per element of [B, T, H, d] (16 x 16384 at n_h 1, d 64: 23.7);
    - the fused glue ops: 400 B per element of [B, T, 2 max(hidden, H d)] (32 x 1024 at d 512: 5.5)."""
    if peaks and peaks.get(c["id"]) is not None:
        return round(CTX_GIB + MEASURED_MARGIN * peaks[c["id"]], 2)
    if c["kind"] == "fused":
        m = c.get("model") or {}
        nbytes = c["B"] * c["T"] * 2 * max(m.get("hidden_size") or 0, (c.get("H") or 0) * (c.get("K") or 0), 1) * 400
    elif c["kind"] == "decode":
        nbytes = c["B"] * c["H"] * c["K"] * c["V"] * 4 * 8
    else:
        d = max(c["K"], c["V"])
        nbytes = max([c["B"] * c["H"] * -(-c["T"] * c["n"] // 64) * 64 * max(d, 64) * 220]
                     + [b * t * c["H"] * d * 250 * c["n"] for b, t in c.get("evals") or []])
    return round(CTX_GIB + ALLOC_FLOOR_GIB + nbytes / 2 ** 30, 2)


def compile_group(c: dict) -> tuple:
    """Cases with the same key run the same kernel binaries (Triton specializes on constexprs and dtypes; the
    batch, length, H and the states only change grids and runtime arguments)."""
    if c["kind"] == "fused":
        return ("fused", c["dtype"], tuple(sorted((c.get("model") or {}).items())))
    return (c["kind"], c["dtype"], c["n"], c["K"], c["V"], c.get("gate") == "none")


def schedule(cases: list[dict], jobs: int, run, capacity_gib: dict | None = None, est=est_gib, group=compile_group):
    """Yield run(c, gpu) for every case, on `jobs` threads, as each finishes (gpu: a key of capacity_gib, or None).

    Order: the first case of each compile group, in the order given; then the others, each once its group's first
    has finished. Memory: the first case in that order whose estimate fits on the GPU with the most room, beside the
    running cases' (capacity_gib: GiB per GPU; None: no limit), starts there; a case larger than a whole GPU runs
    on an idle one. Smaller cases pass a large one that waits for room (session 27: with no passing, two large
    cases held a 16-job pool at a load of 2-4 for 220 s); the large one is not starved, because --jobs small cases
    leave most of a GPU free and a freed slot takes the first case that fits, in order. An exception in run is the
    caller's bug: it ends the schedule."""
    first = {}
    for c in cases:
        first.setdefault(group(c), c["id"])
    lead = [c for c in cases if first[group(c)] == c["id"]]
    pending = lead + [c for c in cases if first[group(c)] != c["id"]]
    caps = dict(capacity_gib) if capacity_gib else {None: float("inf")}
    used = {g: 0.0 for g in caps}
    done_groups: set = set()
    cv = threading.Condition()
    out: queue.Queue = queue.Queue()

    def take():
        with cv:
            while pending:
                g = min(caps, key=lambda g: used[g] - caps[g])  # the GPU with the most room
                for c in pending:
                    if first[group(c)] != c["id"] and group(c) not in done_groups:
                        continue
                    need = est(c) if capacity_gib else 0.0
                    if used[g] + need <= caps[g] or used[g] == 0:
                        pending.remove(c)
                        used[g] += need
                        return c, g, need
                cv.wait()
            return None

    def worker():
        try:
            while (t := take()) is not None:
                c, g, need = t
                try:
                    out.put(("row", run(c, g)))
                finally:
                    with cv:
                        used[g] -= need
                        done_groups.add(group(c))
                        cv.notify_all()
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            out.put(("raise", e))
            with cv:
                pending.clear()
                cv.notify_all()
        finally:
            out.put(("end", None))

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, jobs))]
    for t in threads:
        t.start()
    ended = 0
    while ended < len(threads):
        kind, x = out.get()
        if kind == "row":
            yield x
        elif kind == "raise":
            raise x
        else:
            ended += 1
