#!/usr/bin/env bash
# One device call that measures what is built but not yet on by default (PERF_NOTES says which):
# the forced-only kernels' and off-by-default switches' GPU tests first (a failure is printed,
# the call goes on), then K1 on each z-pair variant (`bench_halo_variants`), the architecture
# fixtures, and `profile_call.sh` on W1 and W2 at batch 4 (`bench` against `bench_old` where the
# bundle has one; the profile times every variant of `profile_models` in the same process).
# Here: `bash tests/gpu/build.sh && bash tests/gpu/bench_bundle.sh`; there, carrying
# `.dev/gb.tar.xz`: `bash tests/gpu/variants_call.sh`.
#   TESTS (it:FILTER ... run before the profile, TEST_S seconds each), GATE (one it test that
#   must pass, else the call stops: a hang or a broken kernel costs nothing more), ROUNDS (1),
#   MMA_TILES=1 (then `bench_mma_tiles`, MMA_TILES_S seconds).
set -u
. "$(dirname "$0")/call_env.sh"
export VOXTILE_SHARED_DIR=$G/shared
mkdir -p "$OUT/g"
nvidia-smi --query-gpu=name --format=csv,noheader
gate=${GATE:-cuda::ops::norm_stats::cin1_norm_recomputed}
timeout 90 "$G/it" --test-threads=1 --nocapture "$gate" > "$OUT/g/gate.log" 2>&1
rc=$?
el "GATE $gate rc $rc: $(grep -E "^test result" "$OUT/g/gate.log")"
grep -E "panicked|FAILED" "$OUT/g/gate.log" | head -20
[ $rc = 0 ] || exit 1
VOXTILE_BENCH_ONLY=K1 timeout 100 "$G/it" --test-threads=1 --nocapture cuda::ops::bench::bench_halo_variants > "$OUT/g/k1.log" 2>&1
el "K1 variants rc $?"
grep -E "RESULT halo" "$OUT/g/k1.log"
# The committed architecture fixtures, where the test binary was built (CARGO_MANIFEST_DIR).
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
# (Every variant: the defaults, the switches off until measured, the old paths.)
timeout 200 "$G/it" --test-threads=1 --nocapture model::archs::architectures_on_the_gpu > "$OUT/g/archs.log" 2>&1
el "archs rc $?: $(grep -E "^test result" "$OUT/g/archs.log")"
grep -E "panicked|FAILED" "$OUT/g/archs.log" | head -10
bins=bench
[ -e "$G/bench_old" ] && bins="bench_old bench"
TEST_S=${TEST_S:-150} TESTS=${TESTS:-"it:cuda::ops::norm it:cuda::ops::conv_wgmma::conv_wgmma_cases it:cuda::ops::concat_split it:cuda::ops::conv_wgmma::conv_wgmma_slices cuda_stream: plan_gpu:"} \
  NETS=w1,w2 BATCHES=4 REPS=5 ROUNDS=${ROUNDS:-1} BINS="$bins" PROFILE_BATCHES=4 PROFILE_S=${PROFILE_S:-90} \
  OUT=$OUT/a bash "$(dirname "$0")/profile_call.sh" 2>&1 | grep -v "^WARNING" | grep -v "^PROF" |
  grep -v "RESULT profile .* kind \|tile stats" | tail -70
# MMA_TILES=1: then the conv_mma tile and split-K sweep of W1's strided and small convs.
if [ "${MMA_TILES:-0}" = 1 ]; then
  timeout "${MMA_TILES_S:-300}" "$G/it" --test-threads=1 --nocapture cuda::ops::bench::bench_mma_tiles > "$OUT/g/mma_tiles.log" 2>&1
  el "mma tiles rc $?"
  grep -E "RESULT mma tiles" "$OUT/g/mma_tiles.log" | cut -c1-160
fi
