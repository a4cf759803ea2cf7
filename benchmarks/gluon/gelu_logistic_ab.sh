#!/usr/bin/env bash
# The fused FP8 experts with the gelu_tanh activation on main's src and on main's src with
# benchmarks/gluon/gelu_logistic.patch applied (the activation in its logistic form), in turn, one process each:
# moe_fp8_sweep.py --activation gelu_tanh (cutile and gluon forms and the public call, kernel-only and eager).
# Run from the repository root on the H200 machine with .devbundle carried:
#   [MODELS=qwen3-30b-a3b,deepseek-v3] [ROWS=64,256,1024] [ROUNDS=1] bash benchmarks/gluon/gelu_logistic_ab.sh
# writes $OUT/gelu_{base,logistic}_<round>.json.
source .devbundle/setup.sh >/dev/null 2>&1
ROOT=$PWD
rm -rf /tmp/gelu_tree && mkdir -p /tmp/gelu_tree && cp -r src /tmp/gelu_tree/src \
  && (cd /tmp/gelu_tree && git init -q && git apply "$ROOT/benchmarks/gluon/gelu_logistic.patch" --include='src/*') || exit 1
for r in $(seq 1 ${ROUNDS:-1}); do
  for tree in base logistic; do
    src=$([ $tree = base ] && echo "$ROOT/src" || echo /tmp/gelu_tree/src)
    PYTHONPATH=$src:$ROOT:${PYTHONPATH:-} timeout 240 python3 benchmarks/gluon/moe_fp8_sweep.py $OUT/gelu_${tree}_$r.json \
      --activation gelu_tanh --models "${MODELS:-qwen3-30b-a3b,deepseek-v3}" --rows-per-expert "${ROWS:-64,256,1024}" \
      --budget-ms 200 > /tmp/gelu_${tree}_$r.txt 2>&1
    echo "== $tree, round $r"; tail -8 /tmp/gelu_${tree}_$r.txt
  done
done
