#!/usr/bin/env bash
# One device call for the z-pair wgmma convs (issue 31, kernels/conv_wgmma_z.cu): the wgmma
# kernels against float64 (`it cuda::ops::conv_wgmma`), then every halo / wgmma variant on K1
# and the other halo layers (`bench_halo_variants`, RESULT lines), then (AB=1) W1 / W2 against
# eager and old binary against new (tests/gpu/ab.py; bench_old in the bundle). Here: `bash tests/gpu/build.sh
# && bash tests/gpu/bench_bundle.sh`; there, carrying `.dev/gb.tar.xz`: `bash tests/gpu/wz_call.sh`.
#   ONLY=K1,64->32 (bench layers), TESTS=0 (skip the tests), AB=1 (the A/B too), NCU=1 (ncu on K1).
set -u
. "$(dirname "$0")/call_env.sh"
if [ "${TESTS:-1}" = 1 ]; then
  timeout 240 "$G/it" cuda::ops::conv_wgmma --test-threads=1 --nocapture > "$OUT/t_wgmma.log" 2>&1
  el "TEST conv_wgmma rc $?"
  grep -E "conv_wz|test result|panicked|FAILED" "$OUT/t_wgmma.log" | tail -30
fi
VOXTILE_BENCH_ONLY=${ONLY:-K1} timeout 200 "$G/it" bench_halo_variants --nocapture --test-threads=1 > "$OUT/b_halo.log" 2>&1
el "bench_halo_variants rc $?"
grep -E "^RESULT|panicked" "$OUT/b_halo.log" | cut -c1-160
if [ "${AB:-0}" = 1 ]; then
  BUNDLE=$G OUT=$OUT timeout 200 bash tests/gpu/bench.sh --only w1,w2 --modes eager --deadline 190 > /dev/null 2>&1
  el "bench w1,w2 rc $?"
  tail -4 "$OUT/bench/bench.md"
  timeout 150 python3 tests/gpu/ab.py "$G/bench_old" "$G/bench" /tmp/voxtile-bench 3 > "$OUT/ab.log" 2>&1
  el "ab rc $?"
  cut -c1-300 "$OUT/ab.log"
fi
if [ "${NCU:-0}" = 1 ] && command -v ncu > /dev/null; then
  VOXTILE_BENCH_ONLY=K1 timeout 200 ncu -k regex:conv_wz --launch-count 2 --set full -o "$OUT/wz" \
    "$G/it" bench_halo_variants --nocapture --test-threads=1 > "$OUT/ncu.log" 2>&1
  el "ncu rc $?"
  ncu -i "$OUT/wz.ncu-rep" --page details 2>/dev/null | grep -E "Duration|Throughput|Eligible|Issue Slots|Registers|Bank" | head -30
fi
