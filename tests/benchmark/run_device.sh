#!/usr/bin/env bash
# One device call's worth of GPU work: the GPU tests, then the inference benchmark, each step
# under its own time budget so one slow step cannot starve the rest. Logs and results go to
# $OUT (at most 8 files come back from the device tool, so steps share one test log).
#
#   source .devbundle/setup.sh && bash tests/benchmark/run_device.sh [steps...]
#
# test steps (default, in this order): dense grouped mqa hf ops
# benchmark steps: bench_dense bench_grouped bench_mqa infer (results under $OUT/results)
set -u
OUT=${OUT:-/tmp/tilegemm-device}
mkdir -p "$OUT"
LOG=$OUT/tests.log
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(dense grouped mqa hf ops)
mkdir -p "$OUT/results"

step() {  # step NAME SECONDS CMD...: run CMD with a time limit, append its output to the log
  local name=$1 budget=$2
  shift 2
  local start=$SECONDS
  echo "===== $name ($*)" >>"$LOG"
  timeout "$budget" "$@" >>"$LOG" 2>&1
  local rc=$?
  local last
  last=$(grep -E "passed|failed|error" "$LOG" | tail -1)
  printf '%-8s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - start))" "$last" | tee -a "$SUMMARY"
}

for s in "${steps[@]}"; do
  case $s in
    # every op's cutile backend against the float64 formulas of tests/ops (awkward shapes included)
    # with fallback disabled, so a case the kernels hand to pytorch shows up as a failure, not a pass
    # -v: one line per test, so the names of failures survive a timeout
    ops) step ops 200 env TILEGEMM_DISABLE_FALLBACK=1 python3 -m pytest -v -m gpu -n 12 -p no:cacheprovider -p no:benchmark \
      --tb=line -rf \
      tests/ops/test_dense.py tests/ops/test_m_grouped.py tests/ops/test_masked.py \
      tests/ops/test_k_grouped.py tests/ops/test_mqa.py tests/ops/test_autograd.py ;;
    grouped) step grouped 90 python3 -m pytest -q -p no:cacheprovider tests/ops/test_grouped_gpu.py ;;
    mqa) step mqa 60 python3 -m pytest -q -p no:cacheprovider tests/ops/test_mqa_gpu.py ;;
    hf) step hf 60 python3 -m pytest -q -p no:cacheprovider -rfE tests/transformers/test_gpu.py ;;
    dense) step dense 140 env TILEGEMM_GPU_TEST_SHAPES=quick python3 -m pytest -q -p no:cacheprovider --tb=line -rf \
      tests/ops/test_dense_gpu.py ;;
    bench_dense) step bench_dense 170 python3 tests/benchmark/bench_dense.py --full --graph --out "$OUT/results" ;;
    bench_grouped) step bench_grouped 100 python3 tests/benchmark/bench_grouped.py --only contiguous --budget 80 \
      --out "$OUT/results" ;;
    bench_mqa) step bench_mqa 50 python3 tests/benchmark/bench_mqa.py --quick --out "$OUT/results" ;;
    infer) step infer 150 python3 modeling/transformers/bench_h100.py --out "$OUT/results" --deadline 130 \
      --static-reserve 50 ;;
    *) echo "unknown step $s" | tee -a "$SUMMARY" ;;
  esac
done
# the device tool returns at most 8 files: ship the results folder as one archive
if [ -n "$(ls -A "$OUT/results")" ]; then tar -czf "$OUT/results.tgz" -C "$OUT" results; fi
rm -rf "$OUT/results"
echo "----- summary"
cat "$SUMMARY"
