#!/usr/bin/env bash
# The benchmark's part of tests/gpu/build.sh's bundle: bench, voxtile (W3), it (K1: the test binary),
# the GPU test binaries cuda_stream and plan_gpu (profile_call.sh's TESTS),
# the peer's wheels and scripts, and the CT that W3 interpolates; and DEST.tar.xz of it (~17 MB),
# which fits a device call beside the tree (the folder, ~35 MB, does not: a call carries 64 MiB in
# all). Run after tests/gpu/build.sh:
#   bash tests/gpu/bench_bundle.sh [SRC=.dev/gpu] [DEST=.dev/gb]
set -euo pipefail
SRC=${1:-.dev/gpu}
DEST=${2:-.dev/gb}
for f in bench voxtile it cuda_stream plan_gpu wheels/peer_e2e.py wheels/make_ct512.py shared/fixtures/volumes/ts_ct_512x512x20.nii.gz; do
  [ -e "$SRC/$f" ] || { echo "bench_bundle.sh: $SRC/$f is missing: run tests/gpu/build.sh first" >&2; exit 1; }
done
mkdir -p "$DEST/wheels" "$DEST/shared/fixtures/volumes"
cp "$SRC/bench" "$SRC/voxtile" "$SRC/it" "$SRC/cuda_stream" "$SRC/plan_gpu" "$DEST/"
cp "$SRC"/wheels/* "$DEST/wheels/"
cp "$SRC/shared/fixtures/volumes/ts_ct_512x512x20.nii.gz" "$DEST/shared/fixtures/volumes/"
# The prebuilt kernel cache (tests/gpu/build.sh), where there is one.
rm -rf "$DEST/cache"
[ -d "$SRC/cache" ] && cp -r "$SRC/cache" "$DEST/"
du -sh "$DEST"
tar -cf - -C "$(dirname "$DEST")" "$(basename "$DEST")" | xz -T2 -6 > "$DEST.tar.xz"
ls -la "$DEST.tar.xz"
