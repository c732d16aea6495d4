#!/usr/bin/env bash
# On the GPU machine: voxtile against its PyTorch + MONAI peers, one run (tests/gpu/bench.py; see
# tests/gpu/README.md). BUNDLE (default .dev/gpu; .dev/gb from tests/gpu/bench_bundle.sh fits a
# device call) holds bench, voxtile, it, wheels/ and shared/. Arguments go to `bench.py run`:
#   BUNDLE=.dev/gb bash tests/gpu/bench.sh --only w1,w2 --modes eager,default --deadline 560
#   BUNDLE=.dev/gb bash tests/gpu/bench.sh --only w5,w6 --w5-modes eager,default --deadline 540   (the transformers)
# The old form `bench.sh w1,w2[,compiled]` (all.sh) still works: eager only, plus compile default
# with `compiled`. Results: $OUT/bench/{bench.json,bench.md,bench.log}.
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
bundle="${BUNDLE:-$here/.dev/gpu}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$bundle"/wheels/*.whl
export PYTHONPATH=/tmp/site LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
out="${OUT:-/tmp/out}/bench"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
if [ $# -gt 0 ] && [[ "$1" != -* ]]; then
  modes=eager; [[ ",$1," == *,compiled,* ]] && modes=eager,default
  set -- --only "$1" --modes "$modes" "${@:2}"
fi
python3 "$here/tests/gpu/bench.py" run --bundle "$bundle" --out "$out" "$@" 2>&1 | tee "$out/bench.log"
