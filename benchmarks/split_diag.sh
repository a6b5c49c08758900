# every (dqkw config i, wy config j) alone, blocking launches, in parallel; then the passing ones timed in one process
cd "$(dirname "$0")/.."
mkdir -p $OUT/diag
for i in 0 1 2 3; do for j in 0 1 2 3; do
  DPX_KERNEL_SYNC=1 CUDA_LAUNCH_BLOCKING=1 DPX_AUTOTUNE_PIN=chunk_dp_bwd_kernel_dqkw:$i,chunk_dp_bwd_kernel_wy:$j \
    timeout 150 python3 benchmarks/split_diag.py check > $OUT/diag/c$i$j.txt 2>&1 &
done; done
wait
cat $OUT/diag/c*.txt | grep '^{' > $OUT/diag_check.jsonl
cat $OUT/diag_check.jsonl | cut -c1-600
combos=""
for i in 0 1 2 3; do for j in 0 1 2 3; do
  if grep "dqkw:$i,chunk_dp_bwd_kernel_wy:$j\"" $OUT/diag_check.jsonl | grep -qv FAULT; then combos="$combos$i.$j,"; fi
done; done
echo "passing: $combos"
# each passing combo timed: one per dqkw config and one per wy config is enough (they are independent kernels)
pick=$(python3 - "$combos" <<'PY'
import sys
cs=[tuple(c.split(".")) for c in sys.argv[1].split(",") if c]
seen_i, seen_j, out = set(), set(), []
for i, j in cs:
    if i not in seen_i or j not in seen_j:
        out.append(f"{i}.{j}"); seen_i.add(i); seen_j.add(j)
print(",".join(out))
PY
)
echo "timing: $pick"
timeout 200 python3 benchmarks/split_diag.py time "$pick" 2>&1 | grep '^{' | tee $OUT/diag_time.jsonl | cut -c1-400
