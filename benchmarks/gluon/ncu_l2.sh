#!/usr/bin/env bash
# Nsight Compute on one large dense FP8 call, the ws kernel (tilegemm's default route on Hopper) beside DeepGEMM:
# is the 128x128 tile bound by L2-to-SM traffic (L2 throughput near its peak while the tensor pipe is not)?
# Run from the repository root with .devbundle carried; results under $OUT.
source .devbundle/setup.sh >/dev/null 2>&1
export PYTHONPATH=src:tests:.:${PYTHONPATH:-}
DG_PREBUILT=1 DG_SKIP_SMOKE=1 bash .devbundle/deepgemm/build.sh >/dev/null 2>&1
SHAPE=${SHAPE:-4096 7168 16384}
METRICS=lts__t_bytes.sum.per_second,lts__t_sectors_srcunit_tex.sum,l1tex__m_xbar2l1tex_read_bytes.sum.per_second
METRICS=$METRICS,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum
for impl in gluon deepgemm; do
  kernel=$([ $impl = gluon ] && echo fp8_gemm_ws_kernel || echo sm90_fp8_gemm_1d2d_impl)  # the 4th call's GEMM
  timeout 150 ncu -k "regex:$kernel" --launch-skip 3 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section WarpStateStats --metrics "$METRICS" python3 benchmarks/gluon/fp8_profile.py $impl $SHAPE \
    > "$OUT/ncu_${impl}.txt" 2>&1
  echo "$impl exit $?"
  grep -E "L2 Cache Throughput|Compute \(SM\) Throughput|lts__t_bytes|xbar2l1tex|gmma_cycles|Duration" "$OUT/ncu_${impl}.txt"
done
