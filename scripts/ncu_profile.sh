#!/usr/bin/env bash
# Where the fused kernel's time goes, by Nsight Compute: issue slots, warp stall reasons, occupancy and
# memory throughput of the many-rows fused kernel (4096 x 3072), and of the few-rows fused kernel next to
# the unfused pair's two kernels (256 x 3072). Installs $WHEEL, default dist/*.whl (INSTALLED=1: profiles
# the package already installed, as gpu_check.sh's ncu stage does); reports in $OUT (default ./gpu_logs).
#
#   bash scripts/ncu_profile.sh
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$REPO/gpu_logs}
mkdir -p "$OUT"
[ -n "${INSTALLED:-}" ] || bash "$REPO/scripts/install_wheel.sh" \
  "${WHEEL:-$(ls "$REPO"/dist/qwen_resnorm_fp4-*.whl | head -1)}" || exit 2
cd "${RUN_DIR:-/tmp}"  # the package under test: the installed one, or the checkout (gpu_check.sh)
sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats
          --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats
          --section MemoryWorkloadAnalysis --print-details all)
stalls=""
for r in barrier long_scoreboard short_scoreboard wait math_pipe_throttle mio_throttle lg_throttle not_selected \
         selected no_instruction dispatch_stall membar drain sleeping branch_resolving; do
  stalls+="smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio,"
done
metrics=(--metrics "${stalls}smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__cycles_elapsed.avg")
status=0
timeout 150 ncu --clock-control none --kernel-name regex:resnorm_quant --launch-skip 3 --launch-count 1 \
  "${sections[@]}" "${metrics[@]}" python3 "$REPO/scripts/ncu_target.py" > "$OUT/ncu_fused_4096.txt" 2>&1 || status=1
timeout 150 ncu --clock-control none --kernel-name regex:"resnorm|nvfp4" --launch-skip 6 --launch-count 3 \
  "${sections[@]}" "${metrics[@]}" python3 "$REPO/scripts/ncu_target.py" --rows 256 --pair > "$OUT/ncu_256.txt" 2>&1 || status=1
grep -E "^  [a-z_]+.*\(|Duration|Issue Slots Busy|stalled|inst_executed|issue_active|Achieved Occupancy|DRAM Throughput" \
  "$OUT"/ncu_*.txt | head -120
exit $status
