#!/usr/bin/env bash
# The dense FP8 public op on two builds of the ws kernel, in turn: the tree's fp8_gemm_ws_kernel.py ("tree") and
# ALT, another version of that file ("alt"), each round one process per build (fp8_ws_sweep.py, DeepGEMM in the same
# process as a fixed reference). Run from the repository root with .devbundle carried:
#   ALT=path/to/fp8_gemm_ws_kernel.py SHAPES=512x2112x7168,... ROUNDS=2 bash benchmarks/gluon/fp8_kernel_ab.sh
# writes $OUT/dense_{alt,tree}_<round>.json.
source .devbundle/setup.sh >/dev/null 2>&1
ROOT=$PWD
BASE=$ROOT/tests:$ROOT:${PYTHONPATH:-}
mkdir -p /tmp/dg && (OUT=/tmp/dg DG_PREBUILT=1 DG_SKIP_SMOKE=1 bash .devbundle/deepgemm/build.sh >/tmp/dg/b.txt 2>&1)
export TILEGEMM_BENCH_DEEPGEMM=$ROOT/.devbundle/deepgemm
rm -rf /tmp/alt_src && cp -r src /tmp/alt_src && cp "$ALT" /tmp/alt_src/tilegemm/ops/gluon/fp8_gemm_ws_kernel.py
cd benchmarks/gluon
for r in $(seq 1 ${ROUNDS:-2}); do
  for build in alt tree; do
    if [ $build = alt ]; then export PYTHONPATH=/tmp/alt_src:$BASE; else export PYTHONPATH=$ROOT/src:$BASE; fi
    timeout 150 python3 fp8_ws_sweep.py $OUT/dense_${build}_$r.json --variants "" --no-gluon --no-cutile \
      --shapes "$SHAPES" --budget-s 120 > /tmp/ab_${build}_$r.txt 2>&1
    echo "== $build, round $r"; tail -16 /tmp/ab_${build}_$r.txt | head -15
  done
done
