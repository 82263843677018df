#!/usr/bin/env bash
# One device call of a tuning session (see docs/testing.md): the GPU tests selected by TESTS_K (a pytest -k
# expression, spaces allowed) on the wheel
# dist_sweep/$TEST_WHEEL, a same-run A/B of the variant wheels given (scripts/shape_sweep.sh) and, when
# PHASES is set, the phase diagnostic (scripts/cta_phases.py) on the wheel dist_sweep/$PHASES.
#   TEST_WHEEL=base TESTS_K=one_cta PHASES=ph_base ROUNDS=2 GRAPH_ROWS=17,256 GRAPH_DIMS=3072 SKIP_BENCH=1 \
#     OUT=$OUT bash scripts/session_run.sh dist_sweep/base dist_sweep/gate
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$REPO/session_logs}; mkdir -p "$OUT"
status=0
if [ -n "${TEST_WHEEL:-}" ]; then
  WHEEL=$(ls "$REPO"/dist_sweep/$TEST_WHEEL/*.whl | head -1) PYTEST_ARGS="-m gpu" PYTEST_K="${TESTS_K:-}" \
    OUT=$OUT/tests bash "$REPO/scripts/gpu_check.sh" tests > "$OUT/tests.log" 2>&1 || status=1
  tail -3 "$OUT/tests.log"
fi
if [ $# -gt 0 ]; then OUT=$OUT/sweep bash "$REPO/scripts/shape_sweep.sh" "$@" || status=1; fi
if [ -n "${PHASES:-}" ]; then
  bash "$REPO/scripts/install_wheel.sh" "$(ls "$REPO"/dist_sweep/$PHASES/*.whl | head -1)" > /dev/null \
    && (cd /tmp && python3 "$REPO/scripts/cta_phases.py" ${PHASE_ARGS:-}) 2>&1 | tee "$OUT/phases.log" || status=1
fi
exit $status
