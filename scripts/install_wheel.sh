#!/usr/bin/env bash
# Installs one wheel of this package on a GPU machine without network (no dependencies, no index), quietly;
# exits non-zero when pip fails. Used by gpu_check.sh, ncu_profile.sh and shape_sweep.sh.
#
#   bash scripts/install_wheel.sh dist/qwen_resnorm_fp4-....whl
set -uo pipefail
[ $# -eq 1 ] && [ -f "$1" ] || { echo "usage: install_wheel.sh WHEEL (got: $*)"; exit 2; }
python3 -m pip install -q --no-deps --no-index --force-reinstall "$1" 2>&1 | { grep -v "^WARNING: Running pip as" || true; }
