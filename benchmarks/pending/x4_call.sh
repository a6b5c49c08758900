#!/usr/bin/env bash
# One call on a 4-GPU machine (device kind nvidia-h200-x4; the session's device time counts the machine, not its
# GPUs): the pending kernels' acceptance check, their speed table and main's forward diagnostics, beside a recipe
# run on main's kernels, each on its own GPUs.
#   source .ci/device_setup.sh && bash benchmarks/pending/x4_call.sh                  (carry .whl; < 600 s)
# Layout (GPU ids as the machine numbers them):
#   a copy of the tree with benchmarks/pending/series applied, imported through PYTHONPATH (its dpx/ gets links to
#   the subpackages, so `dpx.kernels` is the copy's kernels, not the editable install's):
#     GPUs 0,1  gpu_check.py over every case (--gpus 0,1, JOBS cases at once, CHECK_S budget), then
#     GPU 0     the speed table beside fla (device_call.sh PART=speed, SPEED_S)
#   this tree (main's kernels, as committed):
#     GPU 1     after the check: diag_call.sh (out_proto, walk_proto, ncu) unless DIAG=0
#     GPUs 2,3  RECIPE_ARGS through .ci/device_dpx.sh (default: Table 2 `gpu`, seeds 1 and 2, four trials per GPU as
#               the recipe's one-GPU scale has them: gpus_per_trial 0.25), stopped after RECIPE_S
# Writes (at most 8 files come back): $OUT/check.json/.md/_rows.jsonl, $OUT/speed.tgz, $OUT/diag.tgz,
# $OUT/dpx_ws.tgz (the recipe's workspace) and $OUT/logs.tgz (every step's log).
set -u
OUT=${OUT:-$(pwd)/out}
mkdir -p "$OUT/logs"
REPO=$(pwd)
P=${X4_COPY:-/tmp/dpx_patched}  # the patched copy (replaced)
DONE=$OUT/logs/check.done
T0=$SECONDS  # the subshells below inherit it: their own limits count from the call's start
log() { echo "[x4 $((SECONDS - T0))s] $*"; }
nvidia-smi -L

# the recipe on main's kernels, on GPUs 2,3 (device_setup.sh was sourced by the caller: DPX_DEVICE_SETUP=0)
RECIPE_ARGS=${RECIPE_ARGS:-"recipes/table2_formal_languages.yaml scale=gpu seeds=[1,2] hardware.gpus_per_trial=0.25 hardware.max_parallel=8"}
(
  export CUDA_VISIBLE_DEVICES=2,3 DPX_DEVICE_SETUP=0 DPX_WORKSPACE=${X4_WORKSPACE:-/tmp/dpx_ws} DPX_WS_CHECKPOINTS=1 \
         DPX_STOP_AFTER_S=${RECIPE_S:-440} OUT="$OUT"
  # shellcheck disable=SC2086
  bash .ci/device_dpx.sh submit $RECIPE_ARGS --wait > "$OUT/logs/recipe.log" 2>&1
  echo "recipe rc $?" >> "$OUT/logs/recipe.log"
) &
RECIPE_PID=$!

# the patched copy
rm -rf "$P" && mkdir -p "$P" && cp -a "$REPO/." "$P/" || exit 1
for d in orchestrator kernels models tasks registry; do ln -sfn "../$d" "$P/dpx/$d"; done
(
  cd "$P" || exit 1
  export PYTHONPATH="$P${PYTHONPATH:+:$PYTHONPATH}" DPX_DEVICE_COPY=1 OUT="$OUT/p" NAME=check
  python3 -c "import dpx.kernels, sys; p = dpx.kernels.__file__; print('kernels from', p); \
sys.exit(0 if p.startswith('$P') else 'the copy does not import its own kernels')" || exit 1
  PART=1 GPUS=0,1 JOBS=${JOBS:-32} CHECK_S=${CHECK_S:-300} CHECK_TIMEOUT_S=${CHECK_TIMEOUT_S:-380} \
    bash benchmarks/pending/device_call.sh
  touch "$DONE"
  speed_s=$(( ${SPEED_UNTIL_S:-555} - (SECONDS - T0) ))  # the speed table ends before the packing
  (( speed_s > ${SPEED_S:-200} )) && speed_s=${SPEED_S:-200}
  if (( speed_s > 60 )); then CUDA_VISIBLE_DEVICES=0 PART=speed SPEED_S=$speed_s bash benchmarks/pending/device_call.sh
  else echo "speed: only $speed_s s left, skipped"; fi
) > "$OUT/logs/patched.log" 2>&1 &
PATCHED_PID=$!

# main's forward diagnostics on GPU 1 once the check has left it
(
  [ "${DIAG:-1}" = 1 ] || exit 0
  while [ ! -f "$DONE" ] && kill -0 "$PATCHED_PID" 2>/dev/null; do sleep 2; done
  left=$(( ${DIAG_UNTIL_S:-560} - (SECONDS - T0) ))
  [ "$left" -gt 60 ] || { echo "diag: only $left s left, skipped"; exit 0; }
  CUDA_VISIBLE_DEVICES=1 OUT="$OUT/diag" timeout "$left" bash benchmarks/pending/diag_call.sh
) > "$OUT/logs/diag.log" 2>&1 &
DIAG_PID=$!

# progress while they run
while kill -0 "$PATCHED_PID" 2>/dev/null || kill -0 "$RECIPE_PID" 2>/dev/null || kill -0 "$DIAG_PID" 2>/dev/null; do
  sleep 30
  log "check rows $(cat "$OUT"/p/check/check_rows.jsonl 2>/dev/null | wc -l); recipe: $(grep -c 'completed' "$OUT/logs/recipe.log" 2>/dev/null) lines with completed; $(nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader | tr '\n' ' ')"
  if (( SECONDS - T0 > ${HARD_S:-570} )); then log "hard stop"; break; fi
done
killtree() { local c; for c in $(pgrep -P "$1"); do killtree "$c"; done; kill "$1" 2>/dev/null; }
for p in "$PATCHED_PID" "$DIAG_PID" "$RECIPE_PID"; do killtree "$p"; done  # what outlived its own limit
wait
log "done"
for f in check.json check.md check_rows.jsonl; do [ -f "$OUT/p/check/$f" ] && cp "$OUT/p/check/$f" "$OUT/$f"; done
tail -n 12 "$OUT/logs/patched.log"; tail -n 25 "$OUT/logs/diag.log"; tail -n 15 "$OUT/logs/recipe.log"
[ -d "$OUT/p/speed" ] && tar -czf "$OUT/speed.tgz" -C "$OUT/p" speed
[ -d "$OUT/diag" ] && tar -czf "$OUT/diag.tgz" -C "$OUT" diag
tar -czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$OUT/p" "$OUT/diag" "$OUT/logs"
ls -la "$OUT"
