#!/usr/bin/env bash
# Nsight Compute's warp-stall sampling, per SASS instruction, of one dense FP8 call: a ws design (ws:DESIGN) and
# DeepGEMM at the same shape, so that where each kernel's warps wait can be compared (ncu_stall_table.py reads it).
# Run from the repository root with .devbundle carried: SHAPE="M N K" DESIGN=f_128x64_ov2 bash ncu_stalls.sh;
# writes $OUT/details_<impl>.txt (the sections) and $OUT/source_<impl>.csv (the per-instruction table).
source .devbundle/setup.sh >/dev/null 2>&1
export PYTHONPATH=$PWD/src:$PWD/tests:$PWD:${PYTHONPATH:-}
mkdir -p /tmp/dg && (OUT=/tmp/dg DG_PREBUILT=1 DG_SKIP_SMOKE=1 bash .devbundle/deepgemm/build.sh >/tmp/dg/b.txt 2>&1)
export TILEGEMM_BENCH_DEEPGEMM=$PWD/.devbundle/deepgemm
SHAPE=${SHAPE:-512 2112 7168}
for impl in ws:${DESIGN:-f_128x64_ov2} deepgemm; do
  tag=${impl#ws:}
  kernel=$([ $impl = deepgemm ] && echo sm90_fp8_gemm_1d2d_impl || echo fp8_gemm_ws_kernel)
  timeout 200 ncu -k "regex:$kernel" --launch-skip 3 --launch-count 1 --warp-sampling-interval 0 \
    --section WarpStateStats --section SourceCounters --section SchedulerStats --section SpeedOfLight \
    -o /tmp/rep_$tag python3 benchmarks/gluon/fp8_profile.py $impl $SHAPE > $OUT/log_$tag.txt 2>&1
  echo "$impl exit $?"
  ncu -i /tmp/rep_$tag.ncu-rep --page details > $OUT/details_$tag.txt 2>&1
  ncu -i /tmp/rep_$tag.ncu-rep --page source --print-source sass --csv > $OUT/source_$tag.csv 2>&1
done
