#!/usr/bin/env bash
# The k-grouped GPU tests (bitwise reruns included) in 8 processes at once on one GPU, for the tree's ws kernel and,
# with ALT set, for another version of fp8_gemm_ws_kernel.py: a race that a lone process rarely hits shows up under
# the suite's concurrency. Run from the repository root with .devbundle carried:
#   ALT=path/to/fp8_gemm_ws_kernel.py bash benchmarks/gluon/k_grouped_rerun_stress.sh
source .devbundle/setup.sh >/dev/null 2>&1
ROOT=$PWD
BASE=$ROOT/tests:$ROOT:${PYTHONPATH:-}
builds=tree
if [ -n "$ALT" ]; then
  rm -rf /tmp/alt_src && cp -r src /tmp/alt_src && cp "$ALT" /tmp/alt_src/tilegemm/ops/gluon/fp8_gemm_ws_kernel.py
  builds="tree alt"
fi
for build in $builds; do
  if [ $build = alt ]; then export PYTHONPATH=/tmp/alt_src:$BASE; else export PYTHONPATH=$ROOT/src:$BASE; fi
  for w in 1 2 3 4 5 6 7 8; do
    (timeout 80 python3 -m pytest -q -p no:cacheprovider tests/ops/test_grouped_gpu.py \
      tests/ops/test_k_grouped_gluon_gpu.py -k k_grouped > /tmp/stress_${build}_$w.txt 2>&1) &
  done
  wait
  echo "== $build"; grep -h -E "passed|failed" /tmp/stress_${build}_*.txt | sort | uniq -c
  grep -h -E "^(FAILED|E .*rerun)" /tmp/stress_${build}_*.txt | sort | uniq -c | head -8
done
