#!/usr/bin/env bash
# One H200 call, on the device tool's throw-away copy of the tree (never run it in your checkout: it applies the
# pending patches in place): main's n_h 2-3 rows and stages, then the three patches applied, the speed table at the
# patched kernels_sha beside fla in the same run, then the acceptance check's first part on the patched kernels.
#   source .ci/device_setup.sh && DPX_DEVICE_COPY=1 bash benchmarks/pending/device_call.sh
set -u
[ "${DPX_DEVICE_COPY:-}" = 1 ] || { echo "refused: this applies benchmarks/pending/*.patch in place; set DPX_DEVICE_COPY=1 on a throw-away copy"; exit 2; }
OUT=${OUT:-$(pwd)/out}
CACHE=benchmarks/results/kernels_h200_s7/fla_autotune_cache_h200_triton360.tgz
mkdir -p "$OUT/main" "$OUT/pending" "$OUT/check"
echo "main kernels_sha $(python3 benchmarks/gpu_check.py --kernels-sha)"
timeout "${MAIN_S:-90}" python3 benchmarks/kernels.py --out "$OUT/main" --no-check --no-decode --ns 2,3 --bwd-ns 2,3 \
  --fla-ns "" --stages --also-env DPX_KERNEL_SAVE_STATES=1 2>&1 | grep -v '^\[.*{' | tail -n 12
echo "main rc ${PIPESTATUS[0]}"
for p in split-walk dqkwg-gate-early save-states; do git apply "benchmarks/pending/$p.patch" || { echo "patch $p does not apply"; exit 1; }; done
echo "patched kernels_sha $(python3 benchmarks/gpu_check.py --kernels-sha)"
timeout "${PENDING_S:-240}" python3 benchmarks/kernels.py --out "$OUT/pending" --no-check --no-decode --ns 2,3,1 \
  --bwd-ns 2,3,1 --fla-ns 2,3,1 --fla-bwd --stages --also-env DPX_KERNEL_SAVE_STATES=1 --autotune-cache "$CACHE" 2>&1 \
  | grep -v '^\[.*{' | tail -n 16
echo "pending rc ${PIPESTATUS[0]}"
[ "${CHECK_S:-0}" = 0 ] && exit 0
timeout "${CHECK_TIMEOUT_S:-300}" python3 benchmarks/gpu_check.py --out "$OUT/check" --jobs 16 --budget-s "$CHECK_S" --no-fla \
  --name gpu_check_s11_p1 ${RESUME:+--resume "$RESUME"} 2>&1 | tail -n 8
echo "check rc ${PIPESTATUS[0]}"
