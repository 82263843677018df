#!/usr/bin/env bash
# The formatting check CI runs: ruff's lint (ruff.toml) over the Python, clang-format (.clang-format) over csrc/.
# Exits non-zero, naming the files, when a lint rule fails or a C++ file is not formatted. FIX=1 applies ruff's
# safe fixes and clang-format in place instead.
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
cpp=$(git ls-files 'csrc/*.h' 'csrc/*.cuh' 'csrc/*.cu' 'csrc/*.cpp')
if [ "${FIX:-0}" = 1 ]; then
  ruff check --fix . && clang-format -i $cpp
  exit $?
fi
ruff check . || status=1
clang-format --dry-run --Werror $cpp || status=1
[ $status -eq 0 ] && echo "formatting: clean" || echo "formatting: run FIX=1 bash scripts/check_format.sh"
exit $status
