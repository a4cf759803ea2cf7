#!/usr/bin/env bash
# One benchmark script on two builds of src, in turn, each round one process per build: the tree's src ("tree") and
# the src of ALT_TAR ("alt": a tarball of another commit's src/, made beside with
# `mkdir -p .ab && git archive --format=tar.gz -o .ab/alt_src.tgz <commit> src`; .ab is git-ignored), DeepGEMM in the
# same process as a fixed reference. Run from the repository root with .devbundle and .ab carried:
#   SWEEP="grouped_sweep.py --family k --designs g_128x128_ov2 --eager" [ALT_TAR=.ab/alt_src.tgz] [ROUNDS=2] \
#     bash benchmarks/gluon/src_ab.sh
# runs `python3 benchmarks/gluon/<script> $OUT/<build>_<round>.json <its arguments>` for SWEEP="<script> <arguments>";
# writes $OUT/{alt,tree}_<round>.json and .txt. With BUNDLE=.devtriton39 (a bundle of
# ../shared/device/build-triton.sh, carried with .devbundle/deepgemm instead of .devbundle) both builds run under that
# triton, through other_triton.py.
BUNDLE=${BUNDLE:-.devbundle}
source "$BUNDLE/setup.sh" >/dev/null 2>&1
ROOT=$PWD
BASE=$ROOT/tests:$ROOT:${PYTHONPATH:-}
mkdir -p /tmp/dg && (PYTHONPATH=$ROOT/src:$BASE OUT=/tmp/dg DG_PREBUILT=1 DG_SKIP_SMOKE=1 bash .devbundle/deepgemm/build.sh >/tmp/dg/b.txt 2>&1)
export TILEGEMM_BENCH_DEEPGEMM=$ROOT/.devbundle/deepgemm
rm -rf /tmp/alt && mkdir -p /tmp/alt && tar -xzf "${ALT_TAR:-.ab/alt_src.tgz}" -C /tmp/alt || exit 1
read -r script args <<< "$SWEEP"
if [ "$BUNDLE" != .devbundle ]; then script="other_triton.py $script"; fi
cd benchmarks/gluon
for r in $(seq 1 ${ROUNDS:-2}); do
  for build in alt tree; do
    if [ $build = alt ]; then export PYTHONPATH=/tmp/alt/src:$BASE; else export PYTHONPATH=$ROOT/src:$BASE; fi
    timeout ${STEP_TIMEOUT:-150} python3 $script $OUT/${build}_$r.json $args > $OUT/${build}_$r.txt 2>&1
    echo "== $build, round $r"; tail -${TAIL:-12} $OUT/${build}_$r.txt
  done
done
