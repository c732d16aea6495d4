#!/usr/bin/env bash
# The benchmark's part of tests/gpu/build.sh's bundle: bench, voxtile (W3), it (K1: the test binary),
# the peer's wheels and scripts, the CT that W3 interpolates and the sm_90 kernel cache; with
# TEST_BINS=1 also the GPU test binaries cuda_stream and plan_gpu (profile_call.sh's TESTS); and
# DEST.tar.xz of it (~17.5 MB without them), which fits a device call beside the tree (a call
# carries 64 MiB in all; the tracked tree is ~48 MB, so the two test binaries, ~3.5 MB packed,
# fit only where nothing else is carried). Run after tests/gpu/build.sh:
#   bash tests/gpu/bench_bundle.sh [SRC=.dev/gpu] [DEST=.dev/gb]
set -euo pipefail
SRC=${1:-.dev/gpu}
DEST=${2:-.dev/gb}
bins="bench voxtile it"
[ -n "${TEST_BINS:-}" ] && bins="$bins cuda_stream plan_gpu"
for f in $bins wheels/peer_e2e.py wheels/make_ct512.py shared/fixtures/volumes/ts_ct_512x512x20.nii.gz; do
  [ -e "$SRC/$f" ] || { echo "bench_bundle.sh: $SRC/$f is missing: run tests/gpu/build.sh first" >&2; exit 1; }
done
mkdir -p "$DEST/wheels" "$DEST/shared/fixtures/volumes"
rm -f "$DEST/cuda_stream" "$DEST/plan_gpu" "$DEST/bench_old"
for b in $bins; do cp "$SRC/$b" "$DEST/"; done
cp "$SRC"/wheels/* "$DEST/wheels/"
cp "$SRC/shared/fixtures/volumes/ts_ct_512x512x20.nii.gz" "$DEST/shared/fixtures/volumes/"
# The prebuilt kernel cache (tests/gpu/build.sh), where there is one.
rm -rf "$DEST/cache"
[ -d "$SRC/cache" ] && cp -r "$SRC/cache" "$DEST/"
# A cached PTX whose cubin is cached beside it becomes a stub line: the cubin loads
# (`runtime::compile` reads a PTX holding `.entry` as a hit; the PTX is only the fallback for a
# driver that refuses the cubin), and the bundle then fits a call beside the tree.
for f in $(find "$DEST/cache" -name '*.ptx' 2>/dev/null); do
  [ -e "${f%.ptx}.cubin" ] && echo "// bench bundle: the .entry points are in the cubin beside this file" > "$f"
done
du -sh "$DEST"
tar -cf - -C "$(dirname "$DEST")" "$(basename "$DEST")" | xz -T2 --lzma2=preset=9e,dict=128MiB > "$DEST.tar.xz"
ls -la "$DEST.tar.xz"
