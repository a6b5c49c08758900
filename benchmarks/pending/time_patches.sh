#!/usr/bin/env bash
# One H200 call: the pending kernel patches (README here) applied together in a copy of the tree, timed beside fla
# in the same run (the speed table at the patched kernels_sha, with DPX_KERNEL_SAVE_STATES=1 as a second column),
# then main's n_h 2-3 rows and kernel stages for the comparison. After `source .ci/device_setup.sh`:
#   bash benchmarks/pending/time_patches.sh            (writes $OUT/pending/ and $OUT/main/)
set -u
REPO=$(pwd)
OUT=${OUT:-$REPO/out}
CACHE=$REPO/benchmarks/results/kernels_h200_s7/fla_autotune_cache_h200_triton360.tgz
PT=/tmp/dpx_pending
rm -rf "$PT" && mkdir -p "$PT" "$OUT/pending" "$OUT/main"
cp -r kernels benchmarks tests README.md "$PT/"
for p in split-walk dqkwg-gate-early save-states; do
  (cd "$PT" && git apply "benchmarks/pending/$p.patch") || { echo "patch $p does not apply"; exit 1; }
done
echo "main kernels_sha $(python3 benchmarks/gpu_check.py --kernels-sha)"
echo "patched kernels_sha $(cd "$PT" && python3 benchmarks/gpu_check.py --kernels-sha)"
timeout "${PENDING_S:-330}" python3 benchmarks/pending/run_patched.py "$PT" benchmarks/kernels.py --out "$OUT/pending" \
  --no-check --no-decode --ns 2,3,1 --bwd-ns 2,3,1 --fla-ns 2,3,1 --fla-bwd --stages \
  --also-env DPX_KERNEL_SAVE_STATES=1 --autotune-cache "$CACHE" 2>&1 | tail -n 40
echo "pending rc ${PIPESTATUS[0]}"
timeout "${MAIN_S:-140}" python3 benchmarks/kernels.py --out "$OUT/main" --no-check --no-decode --ns 2,3 --bwd-ns 2,3 \
  --fla-ns "" --stages --also-env DPX_KERNEL_SAVE_STATES=1 2>&1 | tail -n 20
echo "main rc ${PIPESTATUS[0]}"
