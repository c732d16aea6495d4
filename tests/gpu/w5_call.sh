#!/usr/bin/env bash
# One device call for W5 (issue 32): the kernel tests it depends on first (they also fill the
# kernel cache: on a fresh machine the first engine took 44 s to open in session 15, which a bench
# run first pays inside its deadline), then W5 against compile default, then the profile of
# the W5 export the bench wrote. Here: `bash tests/gpu/build.sh && bash tests/gpu/bench_bundle.sh`;
# on the H200, carrying `.dev/gb.tar.xz`: `bash tests/gpu/w5_call.sh` (results under $OUT, each
# step cut by its own timeout; about 5 minutes in all).
set -u
t0=$(date +%s)
el() { echo "[$(($(date +%s) - t0)) s] $*"; }
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/bench"
[ -e /tmp/gb/bench ] || tar -xJf .dev/gb.tar.xz -C /tmp
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 VOXTILE_REQUIRE_GPU=1 VOXTILE_REQUIRE_NVRTC=1
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/voxtile-cache}
G=/tmp/gb
for t in cuda::attention cuda::ops::conv::conv_split_k model::archs::architectures_on_the_gpu; do
  f="$OUT/t_${t##*::}.log"
  timeout 120 "$G/it" --test-threads=1 --nocapture "$t" > "$f" 2>&1
  el "TEST $t rc $?"
  grep -E "rel L2|rel_l2|test result|panicked" "$f" | tail -14
done
BUNDLE=$G OUT=$OUT timeout 240 bash tests/gpu/bench.sh --only w5 --w5-modes default --mode-timeout 200 \
  --deadline 230 > /dev/null 2>&1
el "bench rc $?"
tail -8 "$OUT/bench/bench.md" 2>/dev/null
VOXTILE_PROFILE_ONNX=/tmp/voxtile-bench/w5.onnx:96:2 timeout 120 "$G/it" --test-threads=1 --nocapture \
  cuda::ops::bench::profile_models > "$OUT/profile_w5.log" 2>&1
el "profile rc $?"
grep -A40 "RESULT profile" "$OUT/profile_w5.log" | head -50
