#!/usr/bin/env bash
# The dense FP8 ws kernel with a ring deeper than ws_config's cap of 8 stages: a copy of src with the cap raised to
# 16 (so a design takes the deepest ring that fits, e.g. 13 stages of i_64x64_ov2), timed kernel-only by
# fp8_ws_sweep.py with DeepGEMM in the same process. Run from the repository root with .devbundle carried:
#   SHAPES=128x4096x7168,128x2112x7168 VARIANTS=i_64x64_ov2,i_64x64_ov2:stages=8,i_64x64_ov2:stages=11 \
#     bash benchmarks/gluon/ring_depth_probe.sh
# (`name:stages=N` fixes the depth; the cap still bounds it by what fits). Writes $OUT/ring_depth.json and .txt.
source .devbundle/setup.sh >/dev/null 2>&1
ROOT=$PWD
mkdir -p /tmp/dg && (PYTHONPATH=$ROOT/src:$PYTHONPATH OUT=/tmp/dg DG_PREBUILT=1 DG_SKIP_SMOKE=1 bash .devbundle/deepgemm/build.sh >/tmp/dg/b.txt 2>&1)
export TILEGEMM_BENCH_DEEPGEMM=$ROOT/.devbundle/deepgemm
rm -rf /tmp/deep && mkdir -p /tmp/deep && cp -r src /tmp/deep/
WS=/tmp/deep/src/tilegemm/ops/gluon/fp8_gemm_ws.py
sed -i 's/deepest = min(max_stages(cfg, out_bytes, problem.grouping, bool(problem.gated)), 8)/deepest = min(max_stages(cfg, out_bytes, problem.grouping, bool(problem.gated)), 16)/' $WS
grep -q "bool(problem.gated)), 16)" $WS || { echo "the cap was not found in $WS"; exit 1; }
cd benchmarks/gluon
PYTHONPATH=/tmp/deep/src:$PWD:$PYTHONPATH timeout ${STEP_TIMEOUT:-200} python3 fp8_ws_sweep.py $OUT/ring_depth.json \
  --shapes "$SHAPES" --variants "$VARIANTS" --no-gluon --no-cutile --repeat ${REPEAT:-2} > $OUT/ring_depth.txt 2>&1
tail -12 $OUT/ring_depth.txt
