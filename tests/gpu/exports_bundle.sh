#!/usr/bin/env bash
# What tests/gpu/exports.sh needs on the GPU machine, small enough for a device call (~25 MB): the
# release `voxtile` (stripped) and the wheels the GPU image lacks (MONAI, dynamic_network_architectures
# for the nnU-Net nets, nibabel). The scripts themselves travel with the repository. Run here:
#   bash tests/gpu/exports_bundle.sh [DEST=.dev/ex]
# It builds the release binary (cargo build --release --bin voxtile) unless VOXTILE=path names one.
set -euo pipefail
DEST=${1:-.dev/ex}
root="$(cd "$(dirname "$0")/../.." && pwd)"
wheels="$root/../shared/peers/wheels"
bin=${VOXTILE:-}
if [ -z "$bin" ]; then
  (cd "$root" && cargo build --release --bin voxtile)
  bin="${CARGO_TARGET_DIR:-$root/target}/release/voxtile"
fi
mkdir -p "$DEST/wheels"
cp "$bin" "$DEST/voxtile" && strip --strip-all "$DEST/voxtile"
cp "$wheels"/monai-*.whl "$wheels"/dynamic_network_architectures-*.whl "$DEST/wheels/"
# nibabel: tests/gpu/build.sh's copy when there is one, else the registry.
[ -e "$DEST"/wheels/nibabel-*.whl ] || cp "$root"/.dev/gpu/wheels/nibabel-*.whl "$DEST/wheels/" 2>/dev/null ||
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$DEST/wheels" nibabel==5.4.2
du -sh "$DEST"
