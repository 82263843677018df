#!/usr/bin/env bash
# The formatting check CI runs: ruff (ruff.toml) over the Python, clang-format (.clang-format) over csrc/. Exits
# non-zero, naming the files, when anything is not formatted or a lint rule fails. FIX=1 formats in place instead.
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
cpp=$(git ls-files 'csrc/*.h' 'csrc/*.cuh' 'csrc/*.cu' 'csrc/*.cpp')
if [ "${FIX:-0}" = 1 ]; then
  ruff format . && ruff check --fix . && clang-format -i $cpp
  exit $?
fi
ruff format --check . || status=1
ruff check . || status=1
clang-format --dry-run --Werror $cpp || status=1
[ $status -eq 0 ] && echo "formatting: clean" || echo "formatting: run FIX=1 bash scripts/check_format.sh"
exit $status
