#!/usr/bin/env bash
# On the GPU machine: the peer (PyTorch + MONAI) and voxtile in one run, same nets and volume.
# Expects .dev/gpu/ (carried) with: bench (examples/bench built --release), wheels/*.whl (monai,
# dynamic_network_architectures). Usage: bash tests/gpu/bench.sh [w1,w2,compiled]
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
dev="$here/.dev/gpu"
python3 -m pip install -q --no-index --no-deps --target /tmp/site "$dev"/wheels/*.whl
export PYTHONPATH=/tmp/site LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
out="${OUT:-/tmp/out}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 "$here/tests/gpu/bench.py" "$dev/bench" "$out/bench" "${1:-w1,w2}"
