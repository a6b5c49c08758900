#!/usr/bin/env bash
# One GPU call (session 28): dqkwg-bv32.patch timed beside main's gated and non-gated per-chunk gradient kernel
# (dqkwg_diag_call.sh), then, only if it is faster by >= 1 % in all four (n_h 2 and 3, gated and not), the first
# part of the acceptance check at the patched kernels (device_call.sh PART=1 with dqkwg-bv32 added to the series),
# with what is left of the call's ~560 s; else that time checks main's kernels, for the rows' config timings. On the device tool's throw-away copy only (it applies the patch in place).
#   source .ci/device_setup.sh && DPX_DEVICE_COPY=1 bash benchmarks/pending/bv32_call.sh
set -u
[ "${DPX_DEVICE_COPY:-}" = 1 ] || { echo "refused: set DPX_DEVICE_COPY=1 on a throw-away copy"; exit 2; }
T0=$(date +%s)
OUT=${OUT:-$(pwd)/out}
export OUT
DIAG_VARIANTS=gated,plain SKIP_NCU=1 DIAG_NS=2,3 DIAG_S=${DIAG_S:-240} bash benchmarks/pending/dqkwg_diag_call.sh
WIN=1
python3 - "$OUT/dqkwg_diag.json" <<'PY' || WIN=0
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
ok = True
for n in ("2", "3"):
    r = rows[n]
    for new, old in (("dqkwg-bv32", "gated"), ("dqkwg-bv32-plain", "plain")):
        ratio = r[new]["ms"] / r[old]["ms"]
        print(f"bv32 n_h {n} {new}: {r[new]['ms']:.3f} ms against {r[old]['ms']:.3f} ({ratio:.3f}x)")
        ok &= ratio <= 0.99
sys.exit(0 if ok else 1)
PY
LEFT=$(( ${CALL_S:-560} - ($(date +%s) - T0) - 150 ))
echo "check budget ${LEFT}s"
[ "$LEFT" -gt 60 ] || exit 0
if [ "$WIN" = 1 ]; then
  echo dqkwg-bv32 >> benchmarks/pending/series
  PART=1 CHECK_S=$LEFT CHECK_TIMEOUT_S=$(( LEFT + 110 )) NAME=${NAME:-gpu_check_s28} bash benchmarks/pending/device_call.sh
else  # not faster: the rest of the call checks main (covered already) for the config timings of each case
  echo "bv32: not faster everywhere; the check on main instead (config_ms for autotune_wins --regret)"
  mkdir -p "$OUT/check"
  timeout $(( LEFT + 110 )) python3 benchmarks/gpu_check.py --out "$OUT/check" --jobs 16 --budget-s "$LEFT" --no-fla \
    --name gpu_check_s28_main 2>&1 | tail -n 8
fi
