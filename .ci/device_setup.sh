#!/usr/bin/env bash
# Source on the bare GPU machine (the device tool's H200 image: torch + Triton, no pydantic/omegaconf/duckdb/
# mlflow/fla): installs the wheels of .whl/ (from .ci/gpu_wheels.sh; carry it) into /tmp/site and dpx itself
# (editable, no deps), and sets the environment every GPU command here uses.
#   source .ci/device_setup.sh && python3 benchmarks/gpu_check.py --out $OUT
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >/dev/null 2>&1 || { echo "wheel install failed"; return 1 2>/dev/null || exit 1; }
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || { echo "dpx install failed"; return 1 2>/dev/null || exit 1; }
export MLFLOW_DISABLE_TELEMETRY=true RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
