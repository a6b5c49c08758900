#!/usr/bin/env bash
# Run dpx on a bare GPU machine (the device tool's H200 image: torch + Triton, no pydantic/omegaconf/duckdb/mlflow).
#   bash .ci/device_dpx.sh submit recipes/fig5_state_tracking.yaml scale=gpu_small --wait
# Needs .whl/ from .ci/gpu_wheels.sh (carry it). MLflow is off there (tracking.enabled=false is added to
# submit/rerun); the workspace comes back as $OUT/dpx_ws.tgz: unpack it here and `dpx sync -w DIR` logs it to
# MLflow and DuckDB.
set -uo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >/dev/null 2>&1 || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || { echo "dpx install failed"; exit 1; }
export DPX_WORKSPACE=${DPX_WORKSPACE:-/tmp/dpx_ws} MLFLOW_DISABLE_TELEMETRY=true RAY_AUTH_MODE=disabled
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
extra=()
case "${1:-}" in submit|rerun) extra=(tracking.enabled=false) ;; esac
python3 -m dpx.orchestrator.cli "$@" "${extra[@]}"
rc=$?
if [ -n "${OUT:-}" ] && [ -d "$DPX_WORKSPACE" ]; then
  tar -czf "$OUT/dpx_ws.tgz" -C "$(dirname "$DPX_WORKSPACE")" --exclude='*/checkpoints/*' "$(basename "$DPX_WORKSPACE")"
fi
exit $rc
