#!/usr/bin/env bash
# One device call's worth of GPU work: the GPU tests, then the inference benchmark, each step
# under its own time budget so one slow step cannot starve the rest. Logs and results go to
# $OUT (at most 8 files come back from the device tool, so steps share one test log).
#
#   source .devbundle/setup.sh && bash tests/benchmark/run_device.sh [steps...]
#
# steps (default: all, in this order): ops grouped mqa hf infer
set -u
OUT=${OUT:-/tmp/tilegemm-device}
mkdir -p "$OUT"
LOG=$OUT/tests.log
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(ops grouped mqa hf infer)

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
    ops) step ops 210 env TILEGEMM_DISABLE_FALLBACK=1 python3 -m pytest -q -m gpu -n 6 -p no:cacheprovider --tb=line -rf \
      tests/ops/test_dense.py tests/ops/test_m_grouped.py tests/ops/test_masked.py \
      tests/ops/test_k_grouped.py tests/ops/test_mqa.py tests/ops/test_autograd.py ;;
    grouped) step grouped 100 python3 -m pytest -q -p no:cacheprovider tests/ops/test_grouped_gpu.py ;;
    mqa) step mqa 70 python3 -m pytest -q -p no:cacheprovider tests/ops/test_mqa_gpu.py ;;
    hf) step hf 70 python3 -m pytest -q -p no:cacheprovider -rfE tests/transformers/test_gpu.py ;;
    infer)
      mkdir -p "$OUT/infer"
      step infer 150 python3 modeling/transformers/bench_h100.py --out "$OUT/infer" --deadline 130 --static-reserve 50 ;;
    dense) step dense 150 python3 -m pytest -q -p no:cacheprovider tests/ops/test_dense_gpu.py ;;
    *) echo "unknown step $s" | tee -a "$SUMMARY" ;;
  esac
done
echo "----- summary"
cat "$SUMMARY"
