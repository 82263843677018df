#!/usr/bin/env bash
# One device call: the GPU tests and the README's benchmark on the wheel in dist/ (scripts/gpu_check.sh),
# then scripts/placement_probe.py with the fused op's outputs freed at once (the benchmark's timing loop:
# the allocator hands every call the same output blocks) and held for HOLD more calls (each call writes
# fresh blocks, as a model's residual stream does). Logs in $OUT (bench/, gpu_tests.log, probe.log).
#
#   OUT=logs PROBE_ROWS="8192 6889 4096" HOLD=8 bash scripts/benchmark_and_probe.sh
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$REPO/probe_logs}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
status=0
PYTEST_ARGS=${PYTEST_ARGS:--m gpu} OUT=$OUT bash "$REPO/scripts/gpu_check.sh" ${STAGES:-tests bench} || status=1
cd /tmp  # the installed package
{  # a pipeline's left side runs in a subshell: it reports its failures by its exit code
  rc=0
  for rows in ${PROBE_ROWS:-8192 6889 4096}; do
    for hold in 0 "${HOLD:-8}" 0 "${HOLD:-8}"; do
      python3 "$REPO/scripts/placement_probe.py" --rows "$rows" --first-only --rounds 2 --hold "$hold" || rc=1
    done
  done
  exit $rc
} 2>&1 | tee "$OUT/probe.log" || status=1
exit $status
