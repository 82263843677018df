#!/usr/bin/env bash
# The GPU check: the test suite's exhaustive sweep (every test and every parametrization, GPU tests included:
# pytest --exhaustive, tests/helpers/tiers.py), and optionally the benchmark, Nsight Compute and compute-sanitizer,
# with logs in $OUT (default ./gpu_logs). By default it runs from the checkout, which
# must hold the in-place build (the README's quickstart, or a qwen_resnorm_fp4/_C*.so copied in); with
# WHEEL=path it installs that wheel and runs everything against the installed package instead.
#
#   bash scripts/gpu_check.sh [startup] [demo] [tests] [bench] [pdl] [per_token] [gemm] [fp8] [fp8_linear] [model]
#                             [inductor_diff] [ncu] [sanitizer] [emulation] [baseline_tests]
#                                                                                              (default: tests)
#   PYTEST_ARGS="-m gpu" bash scripts/gpu_check.sh tests
#   EXHAUSTIVE=0 bash scripts/gpu_check.sh tests        (the default tier instead: the README's `python -m pytest
#                                                       tests -q`, a representative case of every behaviour)
#   PYTEST_WORKERS=4 bash scripts/gpu_check.sh tests    (pytest-xdist workers sharing the GPU: the exhaustive sweep,
#                                                       about 4,100 tests, is about twice the default's GPU work; few
#                                                       workers, each takes CPU threads and GPU memory)
#   PYTEST_K="not real_width" bash scripts/gpu_check.sh tests     (a -k expression with spaces)
#   WHEEL=dist/qwen_resnorm_fp4-....whl bash scripts/gpu_check.sh tests bench
#   BASELINE_WHEEL=old.whl bash scripts/gpu_check.sh bench fp8 baseline_tests
#       before/after on one machine: stages bench and fp8 run their benchmark of old.whl first, then of this build,
#       same arguments; stage baseline_tests runs the test suite against old.whl (PYTEST_ARGS, PYTEST_WORKERS and the
#       tier as for tests). BASELINE_TREE=dir: the old build's own tree, whose benchmarks/ and tests/ run against it
#       instead of this checkout's (when the scripts or tests changed with it). BASELINE_DIR=dir: a directory holding
#       an older build, instead of BASELINE_WHEEL
#   stages bench, pdl, per_token, gemm, fp8, fp8_linear, model run benchmarks/bench_*.py (BENCH_ARGS, PDL_ARGS,
#   PER_TOKEN_ARGS, GEMM_ARGS, FP8_ARGS, FP8_LINEAR_ARGS, MODEL_ARGS pass options), against the package the tests use
#   EMULATION_WHEEL=emu.whl bash scripts/gpu_check.sh emulation   (the Blackwell emulation wheel, built elsewhere with
#                       QWEN_FP4_EMULATE_BLACKWELL=1, installed into /tmp/emulation_site: the blackwell_emulation
#                       tests, then the whole suite against it (EMULATION_FULL=0: not); EXHAUSTIVE and
#                       PYTEST_WORKERS as for tests; logs emulation_*.txt/log)
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
# wheel paths relative to where the script was started (the stages run from elsewhere)
for var in WHEEL BASELINE_WHEEL EMULATION_WHEEL; do
  if [ -n "${!var:-}" ] && [ -f "${!var}" ]; then printf -v "$var" '%s' "$(cd "$(dirname "${!var}")" && pwd)/$(basename "${!var}")"; fi
done
OUT=${OUT:-$REPO/gpu_logs}
mkdir -p "$OUT"
stages=("$@"); [ ${#stages[@]} -eq 0 ] && stages=(tests)
export PYTHONUNBUFFERED=1
export TORCH_LOGS=${TORCH_LOGS-recompiles}  # dynamo says why it recompiles (TORCH_LOGS= to silence)
[ -z "$TORCH_LOGS" ] && unset TORCH_LOGS  # torch 2.11 fails to import with TORCH_LOGS set but empty
status=0
# The tier of the test stages: the exhaustive sweep unless EXHAUSTIVE=0 (the default tier, as the README runs it).
if [ "${EXHAUSTIVE:-1}" = 0 ]; then TIER=(); else TIER=(--exhaustive); fi

if [ -n "${WHEEL:-}" ]; then
  bash "$REPO/scripts/install_wheel.sh" "$WHEEL" || { echo "installing $WHEEL failed"; exit 2; }
  RUN_DIR=/tmp  # import the installed package, not the source tree
elif [ "${stages[*]}" = emulation ]; then
  RUN_DIR=/tmp  # the emulation stage tests its own wheel only
else
  ls "$REPO"/qwen_resnorm_fp4/_C*.so >/dev/null 2>&1 || { echo "no in-place build in $REPO/qwen_resnorm_fp4 (run the README's quickstart, or pass WHEEL=)"; exit 2; }
  RUN_DIR=$REPO
  export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}  # benchmarks/*.py import the checkout's in-place build
fi
# Optional extras carried as wheels (no network there), e.g. .whl/diffusers-*.whl, into a private target.
if ls "$REPO"/.whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$REPO"/.whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# The baseline of a before/after: an older build (BASELINE_WHEEL, installed into its own target, or BASELINE_DIR),
# run with its own tree's benchmarks and tests where BASELINE_TREE names that tree.
if [ -n "${BASELINE_WHEEL:-}" ]; then
  rm -rf /tmp/baseline && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/baseline \
    "$BASELINE_WHEEL" && BASELINE_DIR=/tmp/baseline || { echo "installing $BASELINE_WHEEL failed"; exit 2; }
fi
BASELINE_TREE=${BASELINE_TREE:+$(cd "$BASELINE_TREE" && pwd)}
BASELINE_TESTS=${BASELINE_TREE:-$REPO}/tests
# baseline_bench SCRIPT NAME ARGS...: benchmarks/SCRIPT.py against the baseline build, logs NAME_baseline.*
baseline_bench() {
  local script=$1 name=$2; shift 2
  [ -n "${BASELINE_DIR:-}" ] || return 0
  (cd /tmp && PYTHONPATH=$BASELINE_DIR${PYTHONPATH:+:$PYTHONPATH} python3 "${BASELINE_TREE:-$REPO}/benchmarks/$script.py" \
     --out "$OUT/${name}_baseline" "$@" 2>&1 | tee "$OUT/${name}_baseline.log") || status=1
}
# run_suite DIR NAME: the test suite in DIR at this run's tier, workers, PYTEST_ARGS and PYTEST_K; logs NAME.log/.xml
# (-rfEs: the failures' names in the summary; -n N: pytest-xdist workers side by side)
run_suite() {
  python3 -m pytest "$1" -p no:cacheprovider -q -rfEs --durations=30 --junitxml="$OUT/$2.xml" \
    ${TIER[@]+"${TIER[@]}"} ${PYTEST_WORKERS:+-n "$PYTEST_WORKERS"} ${PYTEST_ARGS:-} ${PYTEST_K:+-k "$PYTEST_K"} 2>&1 \
    | tee "$OUT/$2.log"
}
cd "$RUN_DIR"
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
  python3 -m qwen_resnorm_fp4 info 2>&1 || python3 -c "import qwen_resnorm_fp4, qwen_resnorm_fp4._library as l; print(qwen_resnorm_fp4.__file__, l.status())"
} 2>&1 | tee "$OUT/env.txt"

for stage in "${stages[@]}"; do
  case "$stage" in
    tests)
      # gpu_tests_progress.tsv: each test's seconds, outcome and failure as it ends (a run a time limit stops too);
      # test_artifacts/: what a failing test writes for a diagnosis (QWEN_FP4_TEST_ARTIFACTS)
      rm -f "$OUT/gpu_tests_progress.tsv"
      QWEN_FP4_TEST_PROGRESS=$OUT/gpu_tests_progress.tsv QWEN_FP4_TEST_ARTIFACTS=$OUT/test_artifacts \
        run_suite "$REPO/tests" gpu_tests || status=1 ;;
    bench)
      baseline_bench bench_fused bench ${BENCH_ARGS:-}
      python3 "$REPO/benchmarks/bench_fused.py" --out "$OUT/bench" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" || status=1 ;;
    baseline_tests)  # the suite against the baseline build, from BASELINE_TREE where given
      [ -n "${BASELINE_DIR:-}" ] || { echo "stage baseline_tests: set BASELINE_WHEEL or BASELINE_DIR"; status=2; continue; }
      (cd /tmp && PYTHONPATH=$BASELINE_DIR${PYTHONPATH:+:$PYTHONPATH} run_suite "$BASELINE_TESTS" baseline_tests) \
        || status=1 ;;
    pdl)  # a GEMM -> fused op pair, programmatic dependent launch on and off
      python3 "$REPO/benchmarks/bench_pdl.py" --out "$OUT/pdl" ${PDL_ARGS:-} 2>&1 | tee "$OUT/pdl.log" || status=1 ;;
    per_token)  # per-token modulation against FlashInfer's DiT kernel (built now from its header)
      python3 "$REPO/benchmarks/bench_per_token.py" --out "$OUT/per_token" ${PER_TOKEN_ARGS:-} 2>&1 | tee "$OUT/per_token.log" || status=1 ;;
    startup)  # a fresh interpreter's and a first CPU inductor compilation's wall time here (the tests start both)
      python3 "$REPO/scripts/startup_times.py" 2>&1 | tee "$OUT/startup.log" || status=1 ;;
    inductor_diff)  # where inductor's fused and unfused compilations of a converted block differ (code + summary)
      python3 "$REPO/scripts/inductor_fused_unfused.py" --out "$OUT/inductor_diff" ${INDUCTOR_DIFF_ARGS:-} 2>&1 \
        | tee "$OUT/inductor_diff.log" || status=1 ;;
    demo)
      python3 -m qwen_resnorm_fp4 demo 2>&1 | tee "$OUT/demo.log" || status=1 ;;
    gemm)  # the NVFP4 GEMM paths against the BF16 GEMM of the same shapes
      python3 "$REPO/benchmarks/bench_gemm.py" --out "$OUT/gemm" ${GEMM_ARGS:-} 2>&1 | tee "$OUT/gemm.log" || status=1 ;;
    fp8)  # the FP8 ops against a copy of the same bytes and the unfused chains
      baseline_bench bench_fp8 fp8 ${FP8_ARGS:-}
      python3 "$REPO/benchmarks/bench_fp8.py" --out "$OUT/fp8" ${FP8_ARGS:-} 2>&1 | tee "$OUT/fp8.log" || status=1 ;;
    fp8_linear)  # FP8Linear (torch._scaled_mm) against BF16 nn.Linear at the Qwen-Image shapes
      python3 "$REPO/benchmarks/bench_fp8_linear.py" --out "$OUT/fp8_linear" ${FP8_LINEAR_ARGS:-} 2>&1 \
        | tee "$OUT/fp8_linear.log" || status=1 ;;
    model)  # a real-width diffusers Qwen-Image transformer: BF16 against converted fused / unfused
      python3 "$REPO/benchmarks/bench_model.py" --out "$OUT/model" ${MODEL_ARGS:-} 2>&1 | tee "$OUT/model.log" || status=1 ;;
    ncu)  # scripts/ncu_profile.sh: 4096 rows fused, 256 rows fused and the pair ($OUT/ncu_*.txt)
      INSTALLED=1 OUT=$OUT RUN_DIR=$RUN_DIR bash "$REPO/scripts/ncu_profile.sh" 2>&1 | tee "$OUT/ncu.log" || status=1 ;;
    sanitizer)
      for tool in memcheck racecheck initcheck synccheck; do
        echo "== compute-sanitizer --tool $tool" >> "$OUT/sanitizer.log"
        compute-sanitizer --tool $tool --error-exitcode 9 python3 "$REPO/scripts/sanitizer_target.py" \
          > /tmp/sanitizer_$tool.log 2>&1 || status=1
        tail -25 /tmp/sanitizer_$tool.log >> "$OUT/sanitizer.log"
        echo "== $tool: $(tail -2 /tmp/sanitizer_$tool.log | tr '\n' ' ')"
      done ;;
    emulation)  # builds nothing here: installs EMULATION_WHEEL into its own target and tests against it
      if [ -z "${EMULATION_WHEEL:-}" ] || [ ! -f "$EMULATION_WHEEL" ]; then
        echo "stage emulation: set EMULATION_WHEEL to the emulation wheel (QWEN_FP4_EMULATE_BLACKWELL=1), got '${EMULATION_WHEEL:-}'"
        status=2; continue
      fi
      rm -rf /tmp/emulation_site
      if ! python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/emulation_site "$EMULATION_WHEEL"; then
        echo "installing $EMULATION_WHEEL failed"; status=1; continue
      fi
      (cd /tmp && export PYTHONPATH=/tmp/emulation_site${PYTHONPATH:+:$PYTHONPATH}
       python3 -m qwen_resnorm_fp4 info 2>&1 | tee "$OUT/emulation_info.txt"
       python3 -c "import qwen_resnorm_fp4.info as i, sys; sys.exit(0 if i.build_info()['blackwell_emulation'] else 1)" \
         || { echo "$EMULATION_WHEEL is not an emulation build"; exit 1; }
       python3 -m pytest "$REPO/tests" -p no:cacheprovider -q -rfEs -m blackwell_emulation --durations=10 \
         ${TIER[@]+"${TIER[@]}"} ${PYTEST_WORKERS:+-n "$PYTEST_WORKERS"} 2>&1 | tee "$OUT/emulation_tests.log"; rc=${PIPESTATUS[0]}
       [ "${EMULATION_FULL:-1}" = 0 ] && exit $rc  # EMULATION_FULL=0: the blackwell_emulation tests only
       python3 -m pytest "$REPO/tests" -p no:cacheprovider -q -rfEs --durations=15 ${TIER[@]+"${TIER[@]}"} \
         ${PYTEST_WORKERS:+-n "$PYTEST_WORKERS"} ${PYTEST_ARGS:-} ${PYTEST_K:+-k "$PYTEST_K"} 2>&1 \
         | tee "$OUT/emulation_full.log"; exit $(( rc || PIPESTATUS[0] ))) \
         || status=1 ;;
    *) echo "unknown stage $stage"; status=2 ;;
  esac
done
exit $status
