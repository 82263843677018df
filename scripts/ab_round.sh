#!/usr/bin/env bash
# Tuning aid: same-run A/B rounds of variant wheels. For each "WHEEL_DIR[:ENV=VALUE]" argument, in order,
# installs the wheel and prints graph-replay times (GRAPH_ROWS, D = 3072) and eager times (BENCH_ROWS).
#   ROUNDS=2 GRAPH_ROWS=256 BENCH_ROWS=4096,8192 bash scripts/ab_round.sh dist_sweep/A dist_sweep/B:QWEN_X=1
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd /tmp
for round in $(seq "${ROUNDS:-1}"); do
  for spec in "$@"; do
    dir=${spec%%:*}; envs=""; [ "$spec" != "$dir" ] && envs=${spec#*:}
    python3 -m pip install -q --no-deps --no-index --force-reinstall "$REPO/$dir"/*.whl 2>&1 | grep -v "^WARNING: Running pip as"
    echo "== round $round: $spec"
    env $envs python3 "$REPO/scripts/graph_replay.py" --rows "${GRAPH_ROWS:-256}" --dims "${DIMS:-3072}" --repeat 2
    [ -z "${BENCH_ROWS:-}" ] || env $envs python3 -m qwen_resnorm_fp4 bench --out "/tmp/ab_$round" --dims "${DIMS:-3072}" \
      --rows "$BENCH_ROWS" --no-compile --reps 60 2>&1 | grep -E "^D=" | sed -E 's/ \(resnorm alone.*//; s/, a copy of the same bytes/; same-bytes copy/'
  done
done
