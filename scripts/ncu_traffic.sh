#!/usr/bin/env bash
# DRAM and L2 traffic of one call, by Nsight Compute with cold caches (its default cache control flushes
# them before each profiled launch): the fused kernel at $ROWS x 3072 (default 8192), and the memory-pattern
# variants of scripts/memory_pattern_bench.cu named in $PATTERNS at the same rows. Diagnostic for
# docs/performance.md ("Why 90% of copy ..."): do the kernels move more bytes than the op's, and where.
#
#   OUT=logs bash scripts/ncu_traffic.sh      (the package installed; nvcc and ncu on PATH)
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$REPO/gpu_logs}
ROWS=${ROWS:-8192}
PATTERNS=${PATTERNS:-R1_128x3_occ6,R1_128x3_occ6_noscales,R1_128x3_occ6_linear(not layout),R4_128x3_occ2,R4_128x3_occ2_noscales}
mkdir -p "$OUT"
metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum
metrics+=,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum
extra=lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum,lts__t_sectors_srcunit_tex_op_write_lookup_miss.sum
extra+=,lts__t_sectors_srcunit_ltcfabric.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed
status=0
cd /tmp
for m in "$metrics" "$extra"; do
  tag=$([ "$m" = "$metrics" ] && echo bytes || echo extra)
  timeout 200 ncu --clock-control none --csv --kernel-name regex:resnorm_quant_kernel --launch-skip 3 --launch-count 1 \
    --metrics "$m" python3 "$REPO/scripts/ncu_target.py" --rows "$ROWS" > "$OUT/ncu_traffic_fused_$tag.csv" 2>&1 || status=1
done
nvcc -O3 -std=c++17 -arch=sm_90a -o /tmp/memory_pattern_bench "$REPO/scripts/memory_pattern_bench.cu" || exit 1
for m in "$metrics" "$extra"; do
  tag=$([ "$m" = "$metrics" ] && echo bytes || echo extra)
  ONLY="$PATTERNS" REPS=1 ROUNDS=1 timeout 300 ncu --clock-control none --csv \
    --kernel-name regex:"row_pattern_kernel|copy_kernel" --metrics "$m" \
    /tmp/memory_pattern_bench "$ROWS" > "$OUT/ncu_traffic_patterns_$tag.csv" 2>&1 || status=1
done
grep -hE '"(gpu__time|dram__|lts__)' "$OUT"/ncu_traffic_*.csv | awk -F'","' '{print $5 " | " $(NF-2) " | " $NF}' | cut -c1-200 | head -200
exit $status
