#!/usr/bin/env bash
# Distributed --compare of the realistic presets (modeling/transformers/dist_check.py) on NPROC devices of this host.
# usage: modeling/transformers/dist_check.sh OUT_DIR [NPROC] [dist_check.py options...]
# Python: $PY (default python3), which must have torch, transformers and tilegemm's dependencies.
set -euo pipefail
out=${1:?usage: dist_check.sh OUT_DIR [NPROC] [dist_check.py options...]}
nproc=${2:-2}
shift $(($# >= 2 ? 2 : 1))
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
exec "${PY:-python3}" -m torch.distributed.run --standalone --nproc-per-node "$nproc" \
    modeling/transformers/dist_check.py --model qwen3-30b-a3b,deepseek-v3 \
    --prompt-tokens 512 --new-tokens 32 --batch-size 1 --out "$out" "$@"
