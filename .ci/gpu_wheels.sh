#!/usr/bin/env bash
# Wheels (CPython 3.12, x86-64) that the GPU machine's image lacks, so `dpx` runs there: pydantic and its core,
# omegaconf, duckdb, and fla-core (the speed and error anchor of the kernel benchmarks) with flash-linear-attention
# (fla.layers: the GatedDeltaProduct layer that benchmarks/layer_gpu.py compares the dpx layer with). MLflow is not carried: there, recipes run with tracking.enabled=false and `dpx sync` logs the
# copied-back run dirs into MLflow here. Output: .whl/ (git-ignored), named in the device tool's `carry`.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
for spec in pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 omegaconf==2.4.0 duckdb==1.5.5 fla-core==0.6.0 flash-linear-attention==0.6.0 einops==0.8.2; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLAT[@]}" -d .whl "$spec"
done
ls -la .whl
