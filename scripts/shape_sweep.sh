#!/usr/bin/env bash
# Tuning on a GPU machine: for each wheel directory given (each a build of one block-shape variant, e.g.
# QWEN_FP4_CUDA_ARCHS=90a wheels with csrc/dispatch.cuh edited), installs it, checks the kernels against
# the reference (tests/test_gpu_kernels.py) and runs a short benchmark. Logs go to $OUT/<variant>.log.
#
#   OUT=sweep_logs bash scripts/shape_sweep.sh dist_sweep/A dist_sweep/B ...
#   SKIP_TESTS=1 ...   for diagnostic builds that are not meant to be correct (e.g. arithmetic removed)
#   SWEEP_TESTS="tests/test_gpu_kernels.py tests/test_special_values.py" ...   other test files (GPU cases only)
#   GRAPH_ROWS=17,64,256 ...   also CUDA-graph replay times at those row counts (scripts/graph_replay.py),
#                              at the widths GRAPH_DIMS (default 3072,5120)
#   SKIP_BENCH=1 ...   no eager benchmark
#   ROUNDS=2 ...   same-run A/B: the whole list again, round after round ($OUT/<variant>.r<round>.log);
#                  the tests run in the first round only
#   dist_sweep/A:QWEN_X=1 ...   a variant with environment variables set for its runs
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$REPO/sweep_logs}
mkdir -p "$OUT"
BENCH=${BENCH_ARGS:---dims 3072,5120 --rows 17,256,1024,4096,8192,32768 --no-compile --reps 60}
cd /tmp
for round in $(seq "${ROUNDS:-1}"); do
  for spec in "$@"; do
    dir=${spec%%:*}; envs=""; [ "$spec" != "$dir" ] && envs=${spec#*:}
    name=$(basename "$dir")${envs:+_${envs//[^A-Za-z0-9]/_}}
    [ "${ROUNDS:-1}" -gt 1 ] && name="$name.r$round"
    log="$OUT/$name.log"
    if ! bash "$REPO/scripts/install_wheel.sh" "$(ls "$REPO/$dir"/*.whl | head -1)"; then
      echo "== $name: installing its wheel failed, skipped"; continue
    fi
    {
      echo "== variant $spec${ROUNDS:+, round $round}"
      [ -n "${SKIP_TESTS:-}" ] || [ "$round" -gt 1 ] || env $envs python3 -m pytest $(printf "$REPO/%s " ${SWEEP_TESTS:-tests/test_gpu_kernels.py}) -p no:cacheprovider \
        -q -x -m gpu -k "not exhaustively" 2>&1 | tail -2
      [ -n "${SKIP_BENCH:-}" ] || env $envs python3 -m qwen_resnorm_fp4 bench --out "/tmp/bench_$name" $BENCH 2>&1 \
        | grep -E "^D=|graph|copy ceiling|overhead"
      [ -z "${GRAPH_ROWS:-}" ] || env $envs python3 "$REPO/scripts/graph_replay.py" --rows "$GRAPH_ROWS" \
        --dims "${GRAPH_DIMS:-3072,5120}" 2>&1
    } > "$log" 2>&1
    echo "== $name: $(grep -E 'passed|failed' "$log" | tail -1)"
  done
done
