#!/usr/bin/env bash
# The gluon backend's GPU tests under a bundled triton (one of ../shared/device/build-triton.sh: .devtriton for 3.7.1,
# .devtriton38 for 3.8.0, .devtriton39 for 3.9.0), recorded as benchmarks/results/gpu-tests/<date>-<tree>-triton<version>.json in $OUT.
# The cuTile bundle does not fit beside a triton bundle, and without cuTile the cutile tests fail on "backend 'cutile'
# cannot run here": so only the tests named for gluon run (`-k gluon`). On the H200 machine, the bundle carried:
#   BUNDLE=.devtriton38 [TILEGEMM_COMMIT=<commit>] bash benchmarks/gluon/gluon_suite_other_triton.sh
set -u
source "$BUNDLE/setup.sh" >/dev/null 2>&1
export PYTHONPATH=$PWD/src:$PWD/tests:$PWD:${PYTHONPATH:-}
python3 -c "import triton; print('triton', triton.__version__)"
log="$OUT/suite_$(basename "$BUNDLE").txt"
timeout 300 python3 tests/gpu_suite.py --budget 290 --record-dir "$OUT" -k gluon > "$log" 2>&1
status=$?
tail -3 "$log"
grep -E "^FAILED|^ERROR" "$log" | head -20
exit $status
