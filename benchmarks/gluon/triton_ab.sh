#!/usr/bin/env bash
# The dense FP8 and BF16 public ops (and any designs named) under the machine's triton and under a bundled one, in
# turn: one process per triton and round, DeepGEMM 2.6.1 (and cuBLAS for BF16) in each as the fixed reference. The
# bundled triton runs with the gluon backend's tested range widened (other_triton.py). Run from the repository root
# on the H200 machine with .devbundle/deepgemm and the bundle carried (the cuTile bundle does not fit beside it):
#   BUNDLE=.devtriton38 SHAPES=512x2112x7168,... BSHAPES=256x1536x2048,... [VARIANTS=d_128x128_ov4,...]
#   [BDESIGNS=rule,...] [ROUNDS=1] [FP8_BUDGET=130] [BF16_BUDGET=80] bash benchmarks/gluon/triton_ab.sh
# writes $OUT/fp8_{base,bundle}_<round>.json and $OUT/bf16_{base,bundle}_<round>.json (triton38_h200.json was made so,
# SHAPES and BSHAPES as its rows).
ROOT=$PWD
BASE=$ROOT/src:$ROOT/tests:$ROOT:${PYTHONPATH:-}
mkdir -p /tmp/dg && (PYTHONPATH=$BASE OUT=/tmp/dg DG_PREBUILT=1 DG_SKIP_SMOKE=1 bash .devbundle/deepgemm/build.sh >/tmp/dg/b.txt 2>&1)
export TILEGEMM_BENCH_DEEPGEMM=$ROOT/.devbundle/deepgemm
t0=$(date +%s)
for r in $(seq 1 ${ROUNDS:-1}); do
  for build in base bundle; do
    (
      export PYTHONPATH=$BASE
      if [ $build = bundle ]; then source "$BUNDLE/setup.sh"; fi
      python3 -c "import triton; print('triton', triton.__version__)"
      timeout 170 python3 benchmarks/gluon/other_triton.py benchmarks/gluon/fp8_ws_sweep.py $OUT/fp8_${build}_$r.json \
        --variants "${VARIANTS:-}" --no-gluon --no-cutile --shapes "$SHAPES" --budget-s ${FP8_BUDGET:-130} > /tmp/f_${build}_$r.txt 2>&1
      echo "== fp8, $build, round $r ($(( $(date +%s) - t0 )) s)"; tail -15 /tmp/f_${build}_$r.txt | head -14
      if [ -n "${BSHAPES:-}" ]; then
        timeout 100 python3 benchmarks/gluon/other_triton.py benchmarks/gluon/bf16_ws_sweep.py $OUT/bf16_${build}_$r.json \
          --shapes "$BSHAPES" --designs "${BDESIGNS:-rule}" --budget-s ${BF16_BUDGET:-80} > /tmp/b_${build}_$r.txt 2>&1
        echo "== bf16, $build, round $r ($(( $(date +%s) - t0 )) s)"; tail -10 /tmp/b_${build}_$r.txt | head -9
      fi
    )
  done
done
