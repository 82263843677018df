#!/usr/bin/env bash
# One device call for a kernel change: the GPU tests on the candidate wheel, Nsight Compute's instruction
# counts and stalls for the baseline and the candidate (scripts/ncu_profile.sh), and same-run A/B rounds of
# the benchmark (scripts/shape_sweep.sh). Logs in $OUT/{tests,ncu_base,ncu_cand,sweep}.
#
#   OUT=ab_logs bash scripts/kernel_ab.sh dist dist_sweep/CANDIDATE
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$REPO/ab_logs}
base=$1; cand=$2
mkdir -p "$OUT"
WHEEL=$(ls "$REPO/$cand"/*.whl | head -1) PYTEST_ARGS="-m gpu -x" OUT=$OUT/tests timeout 240 \
  bash "$REPO/scripts/gpu_check.sh" tests > /dev/null 2>&1
echo "== tests ($cand): $(grep -E 'passed|failed' "$OUT/tests/gpu_tests.log" | tail -1)"
for v in base cand; do
  dir=$base; [ $v = cand ] && dir=$cand
  WHEEL=$(ls "$REPO/$dir"/*.whl | head -1) OUT=$OUT/ncu_$v timeout 200 bash "$REPO/scripts/ncu_profile.sh" > /dev/null 2>&1
  echo "== ncu $v ($dir):"
  grep -E "^  void|smsp__inst_executed.sum|Duration|issue_active" "$OUT/ncu_$v"/ncu_*.txt | sed 's/^.*ncu_//' | cut -c1-150
done
ROUNDS=${ROUNDS:-2} SKIP_TESTS=1 GRAPH_ROWS=${GRAPH_ROWS:-17,256} GRAPH_DIMS=${GRAPH_DIMS:-3072} \
  BENCH_ARGS=${BENCH_ARGS:---dims 3072 --rows 1024,4096,4608,6889,8192,16384 --no-compile --reps 60} \
  OUT=$OUT/sweep timeout ${SWEEP_TIMEOUT:-300} bash "$REPO/scripts/shape_sweep.sh" "$base" "$cand"
for f in "$OUT"/sweep/*.log; do echo "#### $(basename "$f")"; grep -E "^D=|graph" "$f" | cut -c1-220; done
echo "== tests ($cand): $(grep -E 'passed|failed' "$OUT/tests/gpu_tests.log" | tail -1)"  # again, last
grep -E "^FAILED|^E  " "$OUT/tests/gpu_tests.log" | head -20
