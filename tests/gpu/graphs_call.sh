#!/usr/bin/env bash
# One device call for the CUDA-graph replay (issue 31): the pipeline tests (graph replay bitwise
# the steps, the f64 reference, the device gather), then W1 and W2 against eager, then old binary
# against new on W1 / W2 (tests/gpu/ab.py, OLD = the bench built before the graphs, carried as
# bench_old in the bundle), then W5 against eager. Here: `bash tests/gpu/build.sh &&
# bash tests/gpu/bench_bundle.sh`, cuda_stream and bench_old copied into .dev/gb and the tarball
# remade; there, carrying `.dev/gb.tar.xz`: `bash tests/gpu/graphs_call.sh`.
set -u
. "$(dirname "$0")/call_env.sh"
timeout 240 "$G/cuda_stream" --test-threads=1 --nocapture > "$OUT/t_cuda_stream.log" 2>&1
el "TEST cuda_stream rc $?"
grep -E "^RESULT graph|test result|panicked|FAILED" "$OUT/t_cuda_stream.log" | tail -12
BUNDLE=$G OUT=$OUT timeout 200 bash tests/gpu/bench.sh --only w1,w2 --modes eager --deadline 190 > /dev/null 2>&1
el "bench w1,w2 rc $?"
tail -4 "$OUT/bench/bench.md"
timeout 150 python3 tests/gpu/ab.py "$G/bench_old" "$G/bench" /tmp/voxtile-bench 3 > "$OUT/ab.log" 2>&1
el "ab rc $?"
cat "$OUT/ab.log" | cut -c1-300
mkdir -p "$OUT/w5"
BUNDLE=$G OUT=$OUT/w5 timeout 160 bash tests/gpu/bench.sh --only w5 --w5-modes eager --deadline 150 > /dev/null 2>&1
el "bench w5 rc $?"
tail -3 "$OUT/w5/bench/bench.md"
