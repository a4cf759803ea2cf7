#!/usr/bin/env bash
# One device call for the gluon grouped FP8 kernels: their GPU tests (and the dense ws kernel's, whose code they
# share), memcheck of the ws kernel's sanitize cases, then a design sweep beside cutile and DeepGEMM
# (SWEEP_ARGS, e.g. "--family k"). Results under $OUT.
source .devbundle/setup.sh >/dev/null 2>&1
DG_PREBUILT=1 DG_SKIP_SMOKE=1 bash .devbundle/deepgemm/build.sh >/dev/null 2>&1
export PYTHONPATH=src:.:${PYTHONPATH:-}
timeout 150 python3 -m pytest -q -m gpu -n 6 -p no:cacheprovider tests/ops/test_m_grouped_gluon_gpu.py \
  tests/ops/test_k_grouped_gluon_gpu.py tests/ops/test_fp8_gemm_ws_gpu.py tests/ops/test_dense_gluon_gpu.py \
  > "$OUT/gpu_tests.txt" 2>&1
echo "tests exit $?"; grep -E "^FAILED|passed|failed" "$OUT/gpu_tests.txt" | tail -12
TILEGEMM_CHECK_VALUES=0 TILEGEMM_DISABLE_FALLBACK=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 150 \
  compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20 python3 tests/sanitize/cases.py \
  "gluon ws" > "$OUT/memcheck.txt" 2>&1
echo "memcheck exit $?"; grep -E "^(ok|FAIL)|ERROR SUMMARY" "$OUT/memcheck.txt" | tail -5
timeout ${SWEEP_TIMEOUT:-200} python3 benchmarks/gluon/grouped_sweep.py "$OUT/${SWEEP_NAME:-grouped_sweep}.json" \
  --budget-s ${SWEEP_BUDGET:-150} ${SWEEP_ARGS:-} > "$OUT/sweep.txt" 2>&1
echo "sweep exit $?"; tail -16 "$OUT/sweep.txt"
