#!/usr/bin/env bash
# Run dpx on a bare GPU machine (the device tool's H200 image: torch + Triton, no pydantic/omegaconf/duckdb/mlflow).
#   bash .ci/device_dpx.sh submit recipes/fig5_state_tracking.yaml scale=gpu_small --wait
# Needs .whl/ from .ci/gpu_wheels.sh (carry it). MLflow is off there (tracking.enabled=false is added to
# submit, and to rerun when it is given overrides: a rerun without any reuses the last submission's, which hold
# it already); the workspace comes back as $OUT/dpx_ws.tgz: unpack it here and `dpx sync -w DIR` logs it to
# MLflow and DuckDB.
# A run longer than one device call (each is cut off at 600 s), in legs:
#   DPX_WS_CHECKPOINTS=1 DPX_STOP_AFTER_S=420 bash .ci/device_dpx.sh submit RECIPE OVERRIDES... --wait
#   (exit 75: stopped; carry the returned dpx_ws.tgz into the tree, then, as often as it says so)
#   DPX_WS_FROM=dpx_ws.tgz DPX_WS_CHECKPOINTS=1 DPX_STOP_AFTER_S=420 bash .ci/device_dpx.sh rerun RECIPE --failed --wait
# Environment (all optional; unset: the plain behaviour above):
#   DPX_WORKSPACE=DIR      the workspace (default /tmp/dpx_ws)
#   DPX_WS_FROM=FILE.tgz   before running, replace DPX_WORKSPACE by the copy in this tar (a dpx_ws.tgz of an earlier
#                          call: it must hold the folder basename(DPX_WORKSPACE); a relative path is from the
#                          repo root); a missing file is skipped with a note
#   DPX_WS_CHECKPOINTS=1   keep the checkpoints of the trials not completed (no result.json) in $OUT/dpx_ws.tgz
#                          (all */checkpoints/* are left out by default); needed to resume. =all: every checkpoint
#   DPX_STOP_AFTER_S=N     submit/rerun: if the command still runs after N s (or once the script gets SIGUSR1), run
#                          `dpx cancel RECIPE` (RECIPE = $2: running trials get SIGTERM, save a checkpoint and end
#                          `cancelled`; it waits up to 60 s for them), let the --wait view end (DPX_STOP_GRACE_S,
#                          default 30 s, then it is stopped), write the tar and exit 75. `rerun RECIPE --failed` queues
#                          the cancelled trials again; with their checkpoints carried they resume from them.
#                          Leave room in the 600 s: N + cancel (up to ~65 s) + grace + the tar.
#   DPX_DEVICE_SETUP=0     do not source .ci/device_setup.sh (a machine whose python3 has dpx and its deps already,
#                          e.g. tests/test_device_dpx_script.py with the venv's bin first on PATH)
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${DPX_DEVICE_SETUP:-1}" != 0 ]; then source .ci/device_setup.sh || exit 1; fi
export DPX_WORKSPACE=${DPX_WORKSPACE:-/tmp/dpx_ws}
ws_parent=$(dirname "$DPX_WORKSPACE") ws_base=$(basename "$DPX_WORKSPACE")

if [ -n "${DPX_WS_FROM:-}" ]; then
  if [ -f "$DPX_WS_FROM" ]; then
    mkdir -p "$ws_parent" || exit 1
    tmp=$(mktemp -d "$ws_parent/.dpx_ws_from.XXXXXX") || exit 1
    if ! tar -xzf "$DPX_WS_FROM" -C "$tmp"; then
      rm -rf "$tmp"; echo "device_dpx: DPX_WS_FROM=$DPX_WS_FROM: could not unpack it" >&2; exit 1
    fi
    if [ ! -d "$tmp/$ws_base" ]; then
      top=$(ls -A "$tmp" | head -3 | tr '\n' ' ')
      rm -rf "$tmp"
      echo "device_dpx: DPX_WS_FROM=$DPX_WS_FROM holds no folder $ws_base/ (DPX_WORKSPACE=$DPX_WORKSPACE)" \
           "but: ${top:-nothing}" >&2
      exit 1
    fi
    rm -rf "$DPX_WORKSPACE" && mv "$tmp/$ws_base" "$DPX_WORKSPACE" || { rm -rf "$tmp"; exit 1; }
    rm -rf "$tmp"
    echo "device_dpx: workspace $DPX_WORKSPACE restored from $DPX_WS_FROM" >&2
  else
    echo "device_dpx: DPX_WS_FROM=$DPX_WS_FROM: no such file; going on with the workspace as it is" >&2
  fi
fi

extra=()
case "${1:-}" in
  submit) extra=(tracking.enabled=false) ;;
  rerun)  # overrides given: they replace the last submission's, so add ours; none: the last ones (with it) are reused
    for a in "${@:3}"; do
      case "$a" in -*) ;; *=*|\~*) extra=(tracking.enabled=false); break ;; esac
    done ;;
esac
cmd=(python3 -m dpx.orchestrator.cli "$@" "${extra[@]}")

stopped=0
case "${1:-}" in submit|rerun) ;; *) DPX_STOP_AFTER_S= ;; esac
if [ -n "${DPX_STOP_AFTER_S:-}" ]; then
  stop_now=0
  trap 'stop_now=1' USR1
  "${cmd[@]}" &
  pid=$!
  t0=$SECONDS
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$stop_now" = 1 ] || (( SECONDS - t0 >= DPX_STOP_AFTER_S )); then stopped=1; break; fi
    sleep 1
  done
  if [ "$stopped" = 1 ]; then
    stop_s=$((SECONDS - t0))
    echo "device_dpx: stopping after $stop_s s: dpx cancel $2" >&2
    python3 -m dpx.orchestrator.cli cancel "$2"
    for ((i = 0; i < ${DPX_STOP_GRACE_S:-30}; i++)); do  # the --wait view ends once the driver has
      kill -0 "$pid" 2>/dev/null || break
      sleep 1
    done
    kill "$pid" 2>/dev/null
  fi
  wait "$pid"
  rc=$?
  trap - USR1
else
  "${cmd[@]}"
  rc=$?
fi

tgz=
if [ -n "${OUT:-}" ] && [ -d "$DPX_WORKSPACE" ]; then
  excl=(--exclude='*/checkpoints/*')
  case "${DPX_WS_CHECKPOINTS:-0}" in
    all) excl=() ;;
    1)  # the completed trials' checkpoints are never read again: leave them out (the tar stays small over legs)
      xfile=$(mktemp) || exit 1
      for res in "$DPX_WORKSPACE"/runs/*/*/result.json; do
        [ -f "$res" ] && echo "$ws_base/${res#"$DPX_WORKSPACE"/}" | sed 's|/result\.json$|/checkpoints/*|'
      done > "$xfile"
      excl=(--exclude-from="$xfile") ;;
  esac
  tar -czf "$OUT/dpx_ws.tgz" -C "$ws_parent" "${excl[@]}" "$ws_base" && tgz=$OUT/dpx_ws.tgz
  [ -n "${xfile:-}" ] && rm -f "$xfile"
fi
if [ "$stopped" = 1 ]; then
  case "${DPX_WS_CHECKPOINTS:-0}" in
    1|all) ;;
    *) note=" (DPX_WS_CHECKPOINTS was not 1: no checkpoints in the tar, the trials start over)" ;;
  esac
  echo "device_dpx: run stopped after $stop_s s, its trials cancelled${tgz:+, workspace in $tgz}${note:-};" \
       "continue with: DPX_WS_FROM=${tgz:-dpx_ws.tgz} DPX_WS_CHECKPOINTS=1 DPX_STOP_AFTER_S=$DPX_STOP_AFTER_S" \
       "bash .ci/device_dpx.sh rerun $2 --failed --wait" >&2
  exit 75
fi
exit $rc
