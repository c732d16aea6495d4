#!/usr/bin/env bash
# One device call for the transformers (issue 32): the kernel tests they depend on first (they also
# fill the kernel cache: on a fresh machine the first engine took 44 s to open in session 15, which a
# bench run first pays inside its deadline), then the bench, then the profile of the W5 export the
# bench wrote. Here: `bash tests/gpu/build.sh && bash tests/gpu/bench_bundle.sh`; on the H200,
# carrying `.dev/gb.tar.xz`: `bash tests/gpu/w5_call.sh` (results under $OUT, each step cut by its
# own timeout). Knobs (environment):
#   TESTS    test filters, or "none" (default: attention, split-K convs, the architecture fixtures)
#   ONLY     bench workloads (default w5; "w5,w6" is issue 32's call)
#   MODES    peer modes of each of them (default "default": compile default, the best peer since
#            session 10; on a fresh machine its compile took 105 s to over 160 s)
#   BENCH_S  seconds for the bench (default 230); PROFILE=0 skips the profile
set -u
t0=$(date +%s)
el() { echo "[$(($(date +%s) - t0)) s] $*"; }
OUT=${OUT:-/tmp/out}
TESTS=${TESTS:-cuda::attention cuda::ops::conv::conv_split_k model::archs::architectures_on_the_gpu}
ONLY=${ONLY:-w5} MODES=${MODES:-default} BENCH_S=${BENCH_S:-230} PROFILE=${PROFILE:-1}
mkdir -p "$OUT/bench"
[ -e /tmp/gb/bench ] || tar -xJf .dev/gb.tar.xz -C /tmp
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 VOXTILE_REQUIRE_GPU=1 VOXTILE_REQUIRE_NVRTC=1
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/voxtile-cache}
G=/tmp/gb
[ "$TESTS" = none ] && TESTS=
for t in $TESTS; do
  f="$OUT/t_${t##*::}.log"
  timeout 150 "$G/it" --test-threads=1 --nocapture "$t" > "$f" 2>&1
  el "TEST $t rc $?"
  grep -E "rel L2|rel_l2|test result|panicked" "$f" | tail -14
done
BUNDLE=$G OUT=$OUT timeout $((BENCH_S + 10)) bash tests/gpu/bench.sh --only "$ONLY" --w5-modes "$MODES" \
  --w6-modes "$MODES" --mode-timeout $((BENCH_S - 30)) --deadline "$BENCH_S" > /dev/null 2>&1
el "bench rc $?"
tail -12 "$OUT/bench/bench.md" 2>/dev/null
[ "$PROFILE" = 1 ] || exit 0
VOXTILE_PROFILE_ONNX=/tmp/voxtile-bench/w5.onnx:96:2 timeout 120 "$G/it" --test-threads=1 --nocapture \
  cuda::ops::bench::profile_models > "$OUT/profile_w5.log" 2>&1
el "profile rc $?"
grep -A40 "RESULT profile" "$OUT/profile_w5.log" | head -50
