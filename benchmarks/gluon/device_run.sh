#!/usr/bin/env bash
# One device call for the gluon dense FP8 backend: GPU tests, memcheck, then the harness's dense FP8 rows at
# M >= 256 (tilegemm's automatic choice beside cuBLAS, DeepGEMM and the cutile kernel). Results under $OUT.
source .devbundle/setup.sh >/dev/null
DG_PREBUILT=1 DG_SKIP_SMOKE=1 bash .devbundle/deepgemm/build.sh >/dev/null 2>&1
export PYTHONPATH=src:$PYTHONPATH
timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/ops/test_dense_gluon_gpu.py > "$OUT/gpu_tests.txt" 2>&1
tail -3 "$OUT/gpu_tests.txt"
TILEGEMM_CHECK_VALUES=0 TILEGEMM_DISABLE_FALLBACK=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 100 \
  compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20 python3 tests/sanitize/cases.py "dense fp8 gluon" \
  > "$OUT/memcheck.txt" 2>&1
echo "memcheck exit $?"; grep -E "^(ok|FAIL)|passed|ERROR SUMMARY" "$OUT/memcheck.txt" | tail -8
timeout 250 python3 -m tilegemm.bench --full --family dense --where m=256,512,2048,4096,8192 --where dtype=fp8 \
  --save "$OUT/dense_fp8_gluon.json" --markdown "$OUT/dense_fp8_gluon.md" --no-progress > "$OUT/bench.txt" 2>&1
echo "bench exit $?"; tail -25 "$OUT/bench.txt"
