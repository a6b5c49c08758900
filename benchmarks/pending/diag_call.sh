#!/usr/bin/env bash
# One H200 call that says where the forward's walk and output kernels lose to fla's (issue 14 item 4), on main's
# kernels (no patch is applied): the prototypes' timings, then the same kernels once each under Nsight Compute.
#   source .ci/device_setup.sh && bash benchmarks/pending/diag_call.sh            (carry .whl; ~4-5 minutes)
# Writes $OUT/op (out_proto.json), $OUT/wp (walk_proto.json / .md), $OUT/ncu.ncu-rep and $OUT/ncu.txt.
# Each step has its own time limit, so one that hangs or faults leaves the others' results.
set -u
OUT=${OUT:-$(pwd)/out}
mkdir -p "$OUT"
echo "kernels_sha $(python3 benchmarks/gpu_check.py --kernels-sha)"
timeout "${OP_S:-150}" python3 benchmarks/out_proto.py --out "$OUT/op" --ns 2,3 --gated 0,1 2>&1 | tail -n 8
echo "out_proto rc ${PIPESTATUS[0]}"
timeout "${WP_S:-120}" python3 benchmarks/walk_proto.py --out "$OUT/wp" --ns 2,3 --gated 0 --budget-s 60 2>&1 | tail -n 12
echo "walk_proto rc ${PIPESTATUS[0]}"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
if [ -z "$NCU" ]; then echo "ncu: not found"; exit 0; fi
# H200.md: ncu reads the hardware counters on the Firecracker runtime only; --clock-control none leaves the clocks
timeout "${NCU_S:-200}" "$NCU" --profile-from-start off --clock-control none --section SpeedOfLight \
  --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats --section Occupancy \
  -o "$OUT/ncu" -f python3 benchmarks/out_proto.py --out "$OUT/op_ncu" --ns 3 --gated 0 --ncu 2>&1 | tail -n 8
echo "ncu rc ${PIPESTATUS[0]}"
[ -f "$OUT/ncu.ncu-rep" ] && "$NCU" --import "$OUT/ncu.ncu-rep" --page details > "$OUT/ncu.txt" 2>&1
[ -f "$OUT/ncu.txt" ] && grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occupancy" \
  "$OUT/ncu.txt" | head -n 60
exit 0
