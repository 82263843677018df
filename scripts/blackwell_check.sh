#!/usr/bin/env bash
# The Blackwell validation kit: on a B200 / GB200 / B300 / RTX 50 (compute capability 10.x or 12.x), run the
# Blackwell-only tests (bytes equal flashinfer.fp4_quantize of the unfused y in both modes; the FlashInfer GEMM
# backends against the tensor-core path), the GPU suite (its kernels then take the Blackwell path) and the
# benchmark, and pack everything into one report file to send back: blackwell_report_<host>_<time>.tgz.
#
#   bash scripts/blackwell_check.sh                       # the installed qwen_resnorm_fp4 (or the checkout's build)
#   WHEEL=qwen_resnorm_fp4-....whl bash scripts/blackwell_check.sh   # that wheel, in a private target directory
#   QUICK=1 bash scripts/blackwell_check.sh               # the Blackwell-only tests and a short benchmark only
#   BLACKWELL_CHECK_EMULATION=1 bash scripts/blackwell_check.sh      # a dry run on Hopper with the emulation build
#
# Needs the checkout (for tests/), pytest, and flashinfer-python 0.7.4 for the FlashInfer comparisons. On a GPU
# that is not Blackwell it stops with exit code 3, unless BLACKWELL_CHECK_EMULATION=1 and the emulation build
# (QWEN_FP4_EMULATE_BLACKWELL=1) is what imports: then the same stages run, with the blackwell_emulation tests.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
NAME=blackwell_report_$(hostname -s 2>/dev/null || echo host)_$STAMP
WORK=${TMPDIR:-/tmp}/$NAME
DEST=${REPORT_DIR:-$PWD}
mkdir -p "$WORK"
export PYTHONUNBUFFERED=1
status=0
note() { echo "$*" | tee -a "$WORK/summary.md"; }

if [ -n "${WHEEL:-}" ]; then
  rm -rf "$WORK/site" && python3 -m pip install -q --no-deps --no-index --no-compile --target "$WORK/site" "$WHEEL" \
    || { echo "installing $WHEEL failed"; exit 2; }
  export PYTHONPATH=$WORK/site${PYTHONPATH:+:$PYTHONPATH}
fi
# The installed package when one imports from outside the checkout, else the checkout's in-place build.
if (cd /tmp && python3 -c "import qwen_resnorm_fp4" 2>/dev/null); then RUN_DIR=/tmp; else RUN_DIR=$REPO; fi
cd "$RUN_DIR"

gpu=$(python3 -c "import torch; c = torch.cuda.get_device_capability() if torch.cuda.is_available() else None; print(f'{c[0]}.{c[1]}' if c else 'none')" 2>&1 | tail -1)
emulation=$(python3 -c "from qwen_resnorm_fp4 import info; print(int(info.build_info()['blackwell_emulation']))" 2>/dev/null || echo 0)
case "$gpu" in
  10.*|11.*|12.*) kind=blackwell ;;
  *)
    if [ "${BLACKWELL_CHECK_EMULATION:-}" = 1 ] && [ "$emulation" = 1 ]; then
      kind=emulation
    else
      echo "blackwell_check: this is not a Blackwell GPU (compute capability: $gpu); the kit needs a B200, GB200," \
           "B300 or RTX 50 (10.x / 12.x). For a dry run on Hopper install the emulation build" \
           "(QWEN_FP4_EMULATE_BLACKWELL=1) and set BLACKWELL_CHECK_EMULATION=1." >&2
      rm -rf "$WORK"; exit 3
    fi ;;
esac

note "# qwen-resnorm-fp4 Blackwell check ($kind run, $STAMP)"
{
  nvidia-smi; nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,clocks.max.sm --format=csv
  python3 -c "import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__, '| cuda', torch.version.cuda)"
  python3 -m pip list 2>/dev/null | grep -Ei "^(torch|flashinfer|nvidia-cutlass|nvidia-cudnn|triton|qwen)" || true
} > "$WORK/environment.txt" 2>&1
python3 -m qwen_resnorm_fp4 info > "$WORK/info.txt" 2>&1 || status=1
python3 -m qwen_resnorm_fp4 info --json > "$WORK/info.json" 2>&1 || status=1
note "- GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) (compute capability $gpu)"
note "- kernel path: $(grep -m1 '  path:' "$WORK/info.txt" | sed 's/^ *path: *//')"

run_tests() {  # $1: log name, then pytest arguments
  local log=$1; shift
  python3 -m pytest "$REPO/tests" -p no:cacheprovider -q -rs "$@" > "$WORK/$log.log" 2>&1
  local rc=$?
  note "- pytest $*: exit $rc, $(tail -1 "$WORK/$log.log" | tr -d '=' | sed 's/^ *//; s/ *$//')"
  [ $rc -eq 0 ] || status=1
}
if [ "$kind" = blackwell ]; then
  run_tests tests_blackwell -m blackwell
else
  run_tests tests_blackwell -m "blackwell or blackwell_emulation"
fi
[ "${QUICK:-}" = 1 ] || run_tests tests_gpu -m "gpu and not slow" --durations=15
if [ "${QUICK:-}" = 1 ]; then bench_args=(--quick); else bench_args=(); fi
# The checkout's benchmark, importing the package the tests used (PYTHONPATH for the checkout's own build).
if [ "$RUN_DIR" = "$REPO" ]; then bench_path=$REPO${PYTHONPATH:+:$PYTHONPATH}; else bench_path=${PYTHONPATH:-}; fi
PYTHONPATH=$bench_path python3 "$REPO/benchmarks/bench_fused.py" --out "$WORK/bench" "${bench_args[@]}" > "$WORK/bench.log" 2>&1
rc=$?; note "- bench: exit $rc (bench.log, bench/)"; [ $rc -eq 0 ] || status=1
note "- overall: $([ $status -eq 0 ] && echo PASS || echo FAIL)"

tar -czf "$DEST/$NAME.tgz" --exclude="$NAME/site" -C "$(dirname "$WORK")" "$NAME" && rm -rf "$WORK"
echo "report: $DEST/$NAME.tgz (send this file back)"
exit $status
