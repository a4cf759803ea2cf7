#!/usr/bin/env bash
# The 128x64 FP8 tile with each MMA warpgroup a partition of its own (g_128x64_ov2 / _ov4, wg_parts 2) beside the
# lockstep 128x64 design (f_128x64_ov2) and the public op, DeepGEMM 2.6.1 in the same process: fp8_ws_sweep.py on
# rows that run 128x64 tiles. Run from the repository root on the H200 machine with .devbundle carried (results
# aside if the tree is too large):
#   [SHAPES=512x2112x7168,...] [ROUNDS=1] [REPEAT=3] bash benchmarks/gluon/g_128x64_ab.sh
# writes $OUT/g_128x64_<round>.json.
source .devbundle/setup.sh >/dev/null 2>&1
ROOT=$PWD
mkdir -p /tmp/dg && (OUT=/tmp/dg DG_PREBUILT=1 DG_SKIP_SMOKE=1 bash .devbundle/deepgemm/build.sh >/tmp/dg/b.txt 2>&1)
export TILEGEMM_BENCH_DEEPGEMM=$ROOT/.devbundle/deepgemm
export PYTHONPATH=$ROOT/src:$ROOT/tests:$ROOT:${PYTHONPATH:-}
cd benchmarks/gluon
for r in $(seq 1 ${ROUNDS:-1}); do
  timeout 230 python3 fp8_ws_sweep.py $OUT/g_128x64_$r.json --variants f_128x64_ov2,g_128x64_ov2,g_128x64_ov4 \
    --no-gluon --no-cutile --shapes "${SHAPES:-512x2112x7168,1024x2112x7168,512x2112x2048,1024x2112x2048,256x2112x7168}" \
    --repeat "${REPEAT:-3}" --budget-s 200 > $OUT/g_128x64_$r.txt 2>&1
  echo "== round $r"; tail -12 $OUT/g_128x64_$r.txt
done
