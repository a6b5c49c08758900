#!/usr/bin/env bash
# One H200 call on the device tool's throw-away copy of the tree (never in your checkout: it applies the pending
# patches in place). The patches named in benchmarks/pending/series are applied in order; then, by PART:
#   PART=1  the acceptance check's first part at the patched kernels_sha (--budget-s CHECK_S, default 380)
#   PART=2  the rest of it (RESUME=<part 1's _rows.jsonl, copied into the tree>), then the speed table beside fla
#           at the same sha (SPEED_S, default 200; the fla autotune cache of session 7 keeps fla's warm-up short)
#   PART=speed  only the speed table (SPEED_NS, default 2,3,1, as in PART=2)
#   PART=layer  layer_gpu.py --parts check,profile (the fused ops against float64, one mixer's profile beside fla at
#               PROFILE_SHAPE, default fig4:3; LAYER_S, default 240)
# JOBS (default 16): the check's parallel cases; GPUS=0,1: the GPUs its cases go round (gpu_check.py --gpus);
# CHECK_ONLY: gpu_check.py --only (a dry run of the plumbing on a few cases); RERUN (with RESUME): --rerun, run
# those finished rows again (e.g. timeouts); CASE_TIMEOUT_S: --case-timeout-s, one case's limit (default 330).
# A part run again on the same copy skips the patches already applied.
# MAIN_SPEED_NS=3 (any part): first, before the patches, main's kernels.py rows at those n_h (MAIN_SPEED_S, default
# 150), which record each kernel's autotune pick and the tuning's timings
#   source .ci/device_setup.sh && DPX_DEVICE_COPY=1 PART=1 bash benchmarks/pending/device_call.sh
# The check skips fla's phase (--no-fla): the patches change the gated backward (fla's gated backward does not run
# on Triton 3.6, so no fla row covers it) and where the saved states are read (bit-identical to recomputing them,
# tests/test_kernels_triton.py), so fla's error rows of session 8 still stand for the non-gated 16-bit cases.
set -u
[ "${DPX_DEVICE_COPY:-}" = 1 ] || { echo "refused: this applies benchmarks/pending/*.patch in place; set DPX_DEVICE_COPY=1 on a throw-away copy"; exit 2; }
PART=${PART:?PART=1, 2 or speed}
OUT=${OUT:-$(pwd)/out}
NAME=${NAME:-gpu_check_pending}
CACHE=benchmarks/results/kernels_h200_s7/fla_autotune_cache_h200_triton360.tgz
mkdir -p "$OUT/check"
echo "main kernels_sha $(python3 benchmarks/gpu_check.py --kernels-sha)"
speed() {  # $1: output folder, $2: n_h list, $3: limit (s), then extra kernels.py arguments
  local dir=$1 ns=$2 limit=$3; shift 3
  mkdir -p "$dir"
  timeout "$limit" python3 benchmarks/kernels.py --out "$dir" --no-check --no-decode --ns "$ns" --bwd-ns "$ns" \
    --fla-ns "$ns" --fla-bwd --stages --autotune-cache "$CACHE" "$@" 2>&1 | grep -v '^\[.*{' | tail -n 16
  echo "speed ($dir) rc ${PIPESTATUS[0]}"
}
# e.g. MAIN_SPEED_NS=3: main's speed rows (with each kernel's picks) first
[ -n "${MAIN_SPEED_NS:-}" ] && speed "$OUT/main_speed" "$MAIN_SPEED_NS" "${MAIN_SPEED_S:-150}"
grep -v '^#' benchmarks/pending/series | while read -r p; do
  [ -n "$p" ] || continue
  if git apply --reverse --check "benchmarks/pending/$p.patch" 2>/dev/null; then  # a second part on the same copy
    echo "already applied $p"; continue
  fi
  git apply "benchmarks/pending/$p.patch" || { echo "patch $p does not apply"; exit 1; }
  echo "applied $p"
done || exit 1
echo "patched kernels_sha $(python3 benchmarks/gpu_check.py --kernels-sha)"
check() {  # $1: budget (s); RESUME, if set, is part 1's rows
  timeout "${CHECK_TIMEOUT_S:-$(( ${1%.*} + 120 ))}" python3 benchmarks/gpu_check.py --out "$OUT/check" \
    --jobs "${JOBS:-16}" ${GPUS:+--gpus "$GPUS"} ${CHECK_ONLY:+--only "$CHECK_ONLY"} \
    --budget-s "$1" --no-fla --name "$NAME" ${RESUME:+--resume "$RESUME"} ${RERUN:+--rerun "$RERUN"} \
    ${CASE_TIMEOUT_S:+--case-timeout-s "$CASE_TIMEOUT_S"} 2>&1 | tail -n 8
  echo "check rc ${PIPESTATUS[0]}"
}
case "$PART" in
  1) check "${CHECK_S:-380}" ;;
  2) [ -n "${RESUME:-}" ] || { echo "PART=2 needs RESUME=<part 1's _rows.jsonl>"; exit 2; }
     check "${CHECK_S:-300}"; speed "$OUT/speed" "${SPEED_NS:-2,3,1}" "${SPEED_S:-200}" --also-env DPX_KERNEL_SAVE_STATES=0 ;;
  speed) speed "$OUT/speed" "${SPEED_NS:-2,3,1}" "${SPEED_S:-200}" --also-env DPX_KERNEL_SAVE_STATES=0 ;;
  layer) mkdir -p "$OUT/layer"  # the fused ops (kernels/fused) against float64 on the GPU, then one mixer's profile
     timeout "${LAYER_S:-240}" python3 benchmarks/layer_gpu.py --out "$OUT/layer" --wheels .whl --parts check,profile \
       --profile-shape "${PROFILE_SHAPE:-fig4:3}" --budget-s "$(( ${LAYER_S:-240} - 15 ))" 2>&1 | tail -n 12
     echo "layer rc ${PIPESTATUS[0]}"; head -24 "$OUT/layer/layer_profile.md" 2>/dev/null ;;
  *) echo "PART: expected 1, 2, speed or layer, got $PART"; exit 2 ;;
esac
