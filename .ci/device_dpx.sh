#!/usr/bin/env bash
# Run dpx on a bare GPU machine (the device tool's H200 image: torch + Triton, no pydantic/omegaconf/duckdb/mlflow).
#   bash .ci/device_dpx.sh submit recipes/fig5_state_tracking.yaml scale=gpu_small --wait
# Needs .whl/ from .ci/gpu_wheels.sh (carry it). MLflow is off there (tracking.enabled=false is added to
# submit/rerun); the workspace comes back as $OUT/dpx_ws.tgz: unpack it here and `dpx sync -w DIR` logs it to
# MLflow and DuckDB.
set -uo pipefail
cd "$(dirname "$0")/.."
source .ci/device_setup.sh || exit 1
export DPX_WORKSPACE=${DPX_WORKSPACE:-/tmp/dpx_ws}
extra=()
case "${1:-}" in submit|rerun) extra=(tracking.enabled=false) ;; esac
python3 -m dpx.orchestrator.cli "$@" "${extra[@]}"
rc=$?
if [ -n "${OUT:-}" ] && [ -d "$DPX_WORKSPACE" ]; then
  tar -czf "$OUT/dpx_ws.tgz" -C "$(dirname "$DPX_WORKSPACE")" --exclude='*/checkpoints/*' "$(basename "$DPX_WORKSPACE")"
fi
exit $rc
