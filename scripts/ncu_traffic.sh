#!/usr/bin/env bash
# DRAM and L2 traffic of one call, by Nsight Compute with cold caches (its default cache control flushes
# them before each profiled launch): the fused kernel at $ROWS x 3072 (default 8192), and the memory-pattern
# variants of scripts/memory_pattern_bench.cu named in $PATTERNS at the same rows. Diagnostic for
# docs/performance.md ("Why 90% of copy ..."): do the kernels move more bytes than the op's, and where.
# Prints the median of each metric per kernel (the table of docs/perf/ncu_traffic_*.txt); raw CSVs in $OUT.
#
#   OUT=logs bash scripts/ncu_traffic.sh      (the package installed; nvcc and ncu on PATH)
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$REPO/gpu_logs}
ROWS=${ROWS:-8192}
PATTERNS=${PATTERNS:-R1_128x3_occ6,R1_128x3_occ6_noscales,R1_128x3_occ6_linear(not layout),R4_128x3_occ2,R4_128x3_occ2_noscales}
mkdir -p "$OUT"
# Two groups, so that a metric this GPU lacks (the second group) does not cost the byte counts.
bytes=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum
bytes+=,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum
extra=lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum,lts__t_sectors_srcunit_tex_op_write_lookup_miss.sum
extra+=,lts__t_sectors_srcunit_ltcfabric.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed
status=0
cd /tmp

# profile NAME KERNEL_REGEX [ncu options...] -- COMMAND...: both metric groups, into $OUT/ncu_traffic_NAME_<group>.csv
profile() {
  local name=$1 regex=$2; shift 2
  local opts=(); while [ $# -gt 0 ] && [ "$1" != "--" ]; do opts+=("$1"); shift; done; shift
  for group in bytes extra; do
    timeout 300 ncu --clock-control none --csv --kernel-name regex:"$regex" "${opts[@]}" --metrics "${!group}" \
      "$@" > "$OUT/ncu_traffic_${name}_$group.csv" 2>&1 || status=1
  done
}

profile fused resnorm_quant_kernel --launch-skip 3 --launch-count 1 -- \
  python3 "$REPO/scripts/ncu_target.py" --rows "$ROWS"
nvcc -O3 -std=c++17 -arch=sm_90a -o /tmp/memory_pattern_bench "$REPO/scripts/memory_pattern_bench.cu" || exit 1
export ONLY="$PATTERNS" REPS=1 ROUNDS=1  # the variants named, one timed call each
profile patterns "row_pattern_kernel|copy_kernel" -- /tmp/memory_pattern_bench "$ROWS"

python3 - "$OUT" <<'PY'
import csv, glob, statistics, sys
from collections import defaultdict
values, order = defaultdict(lambda: defaultdict(list)), []
for path in sorted(glob.glob(f"{sys.argv[1]}/ncu_traffic_*.csv")):
    for r in csv.reader(line for line in open(path) if line.startswith('"')):
        if len(r) < 15 or r[0] == "ID":
            continue
        kernel = r[4].replace("void ", "").replace("(Buffers)", "")
        order += [kernel] if kernel not in order else []
        values[kernel][r[12]].append(float(r[14].replace(",", "")))
print("kernel | us | DRAM read MB | DRAM written MB | L2 read sectors | L2 write sectors | launches")
for k in order:
    v = values[k]
    med = lambda m, scale=1.0, digits=2: f"{statistics.median(v[m]) / scale:,.{digits}f}" if v.get(m) else "-"
    print(f"{k} | {med('gpu__time_duration.sum', 1e3)} | {med('dram__bytes_read.sum', 1e6)} | "
          f"{med('dram__bytes_write.sum', 1e6)} | {med('lts__t_sectors_srcunit_tex_op_read.sum', digits=0)} | "
          f"{med('lts__t_sectors_srcunit_tex_op_write.sum', digits=0)} | {len(v.get('gpu__time_duration.sum', []))}")
PY
exit $status
