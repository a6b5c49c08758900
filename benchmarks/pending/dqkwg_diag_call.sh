#!/usr/bin/env bash
# One GPU call on main's kernels (no patch): which gate-gradient term of the gated per-chunk gradient kernel costs
# (benchmarks/dqkwg_diag.py), then main's gated and non-gated kernel once each under Nsight Compute (8 warps, 2
# stages: the autotuner's pick for both at B=4 T=4096 H=16 d=128 bf16, session 18).
#   source .ci/device_setup.sh && bash benchmarks/pending/dqkwg_diag_call.sh        (~4 minutes)
set -u
OUT=${OUT:-$(pwd)/out}
mkdir -p "$OUT"
echo "kernels_sha $(python3 benchmarks/gpu_check.py --kernels-sha)"
# dg-lean.patch's chunk_bwd.py as one more variant (fewer cross-warp reductions: G_L loaded, two row sums in one, q . dq for 16-bit inputs)
EXTRA=()
# (dg-pass, session 25, was 1.13-1.15x slower in session 27 and dqkwg-bv32 1.02-1.16x in session 29: in git history)
for P in dg-lean; do
  if git apply "benchmarks/pending/$P.patch"; then
    cp kernels/delta_product/chunk_bwd.py "$OUT/${P}_chunk_bwd.py" && EXTRA+=(--extra "$P=$OUT/${P}_chunk_bwd.py")
    git apply -R "benchmarks/pending/$P.patch"
  else echo "$P.patch does not apply"; fi
done
VARIANTS=()
[ -n "${DIAG_VARIANTS:-}" ] && VARIANTS=(--variants "$DIAG_VARIANTS")   # e.g. gated,plain,-all (default: every one)
timeout "${DIAG_S:-300}" python3 benchmarks/dqkwg_diag.py --out "$OUT" --ns "${DIAG_NS:-2,3,1}" --jobs 14 "${EXTRA[@]}" \
  "${VARIANTS[@]}" \
  2>&1 | tail -n 52
echo "dqkwg_diag rc ${PIPESTATUS[0]}"
[ -n "${SKIP_NCU:-}" ] && exit 0
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
if [ -z "$NCU" ]; then echo "ncu: not found"; exit 0; fi
DPX_AUTOTUNE_PIN=chunk_dp_bwd_kernel_dqkwg:2 timeout "${NCU_S:-150}" "$NCU" --clock-control none \
  -k regex:chunk_dp_bwd_kernel_dqkwg --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
  --section LaunchStats --section Occupancy --section ComputeWorkloadAnalysis -o "$OUT/ncu" -f \
  python3 benchmarks/dqkwg_diag.py --compile-only --ns 2 --variants plain 2>&1 | tail -n 4
echo "ncu rc ${PIPESTATUS[0]}"
[ -f "$OUT/ncu.ncu-rep" ] && "$NCU" --import "$OUT/ncu.ncu-rep" --page details > "$OUT/ncu.txt" 2>&1
[ -f "$OUT/ncu.txt" ] && grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Local|Stall|Issued Ipc|Warp Cycles" "$OUT/ncu.txt" | head -n 60
exit 0
