#!/usr/bin/env bash
# The multi-GPU checks of the MoE harness in one call (modeling/transformers/dist_suite.py): correctness and speed at
# several world sizes under one time budget; results under --out.
# usage: bash modeling/transformers/dist_suite.sh --out DIR [--part correctness|speed|all] [--world-sizes 1,2,4]
#        [--budget SECONDS] [--models NAME:LAYERS,...] [--deep NAME:LAYERS] [--dry-run] [--list]
# Python: $PY (default python3) with torch, transformers (>= 5.21 for the sharded layouts) and tilegemm's dependencies.
# Wheels in .whl/ (a newer transformers, say) are installed into /tmp/site first and put on PYTHONPATH.
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${PY:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD:$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
"$py" -c "import torch, transformers; from tilegemm.transformers.parallel import parallel_api_problem as p; \
print('torch', torch.__version__, '| transformers', transformers.__version__, '| GPUs', torch.cuda.device_count(), \
'| sharding:', p() or 'ok', flush=True)" >&2
exec "$py" modeling/transformers/dist_suite.py "$@"
