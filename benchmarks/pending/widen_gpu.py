"""The autotune-spaces patch's fallback, on a GPU: narrow chunk_dp_bwd_kernel_dqkwg's 16-bit d 256 space back to
what session 31's check faulted with ({(None, 8, 2)}: 233,472 B of shared memory non-gated at n_h 2, over the
232,448 B limit), run that case (gpu_check.py's `chunk f16 n2 K256V256 H2 2x150 g=none ...`) in this process, and
require that it passes against the float64 reference with the kernel widened to its whole space.

    python3 benchmarks/pending/widen_gpu.py   (on the device, the patches of series applied; prints one JSON line)
"""
import json
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_check  # noqa: E402
from dpx.kernels.delta_product import autotune_spaces as sp  # noqa: E402

sp.SPACES["chunk_dp_bwd_kernel_dqkwg"]["16bit"][256] = {(None, 8, 2)}  # the closure holds this dict: narrowed
c = gpu_check.case(dtype="float16", n=2, K=256, H=2, B=2, T=150, gate="none")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    row = gpu_check.run_case(c)
status, bad = gpu_check.judge(c, row)
out = {"id": c["id"], "status": status, "bad": bad, "widened": sorted(sp.WIDENED),
       "dqkwg": gpu_check.config_timings().get("chunk_dp_bwd_kernel_dqkwg"),
       "warnings": [str(w.message) for w in caught if "dpx:" in str(w.message)],
       "errors": {k: float(f"{v:.3g}") for k, v in row["errors"].items()}}
print("WIDEN_GPU " + json.dumps(out))
sys.exit(0 if status == "pass" and out["widened"] == ["chunk_dp_bwd_kernel_dqkwg"] else 1)
