#!/usr/bin/env bash
# On the GPU machine, from the repository root, after tests/gpu/build.sh here and a device call
# carrying .dev/gpu: the GPU test suite, then the benchmark against the PyTorch peer.
#   bash tests/gpu/all.sh [bench workloads, default w1,w2]
cd "$(dirname "$0")/../.."
bash tests/gpu/run.sh .dev/gpu; suite=$?
bash tests/gpu/bench.sh "${1:-w1,w2}"; bench=$?
echo "suite rc $suite, bench rc $bench"
exit $(( suite || bench ))
