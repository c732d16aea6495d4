#!/usr/bin/env bash
# Builds everything the GPU machine runs (it has no cargo) into DEST (default .dev/gpu), which the
# device call carries: the test binaries (`it`, the one integration binary; `cuda_stream` and
# `plan_gpu`, the two that need a process of their own; `voxtile_lib`, the unit tests), the release
# `voxtile` and `bench` binaries, a copy of the shared fixtures (../shared does not travel), the
# peer's wheels and the kernel cache of an sm_90 device (`cache/`). Then, there: tests/gpu/all.sh.
set -euo pipefail
DEST=${1:-.dev/gpu}
mkdir -p "$DEST"
BINS="it cuda_stream plan_gpu"
# shellcheck disable=SC2046
cargo test --no-run --message-format=json --lib $(printf -- '--test %s ' $BINS) 2>/dev/null |
  python3 -c '
import json, sys, shutil
dest = sys.argv[1]
for line in sys.stdin:
    m = json.loads(line)
    kind = m.get("target", {}).get("kind", [""])[0]
    if m.get("reason") == "compiler-artifact" and m.get("executable") and kind in ("lib", "test") and m["target"]["name"] in sys.argv[2].split() + ["voxtile"]:
        name = "voxtile_lib" if kind == "lib" else m["target"]["name"]
        shutil.copy(m["executable"], f"{dest}/{name}")
        print(name, m["executable"])
' "$DEST" "$BINS"
cargo build --release --bin voxtile --example bench
t=${CARGO_TARGET_DIR:-target}
cp "$t/release/voxtile" "$t/release/examples/bench" "$DEST/"
# Debug info only makes the transfer larger.
for f in $BINS voxtile_lib voxtile bench; do strip --strip-all "$DEST/$f"; done
shared="$(cd "$(dirname "$0")/../.." && pwd)/../shared"
if [ -d "$shared" ]; then
  mkdir -p "$DEST/shared/fixtures" "$DEST/wheels"
  cp -r "$shared/fixtures/models" "$shared/fixtures/sliding_window" "$DEST/shared/fixtures/"
  mkdir -p "$DEST/shared/fixtures/volumes"
  cp "$shared/fixtures/volumes/ts_ct_512x512x20.nii.gz" "$DEST/shared/fixtures/volumes/"
  # Local check only (licence unknown): carried in the git-ignored folder, never committed.
  [ -d "$shared/fixtures/trained_meshnet" ] && cp -r "$shared/fixtures/trained_meshnet" "$DEST/shared/fixtures/"
  cp "$shared"/peers/wheels/*.whl "$shared"/peers/peer_e2e.py "$shared"/peers/make_ct512.py "$DEST/wheels/"
  # W3's peer and make_ct512.py need nibabel, which the GPU machine lacks.
  [ -e "$DEST"/wheels/nibabel-*.whl ] || python3 -m pip download -q --no-deps --only-binary=:all: \
    -d "$DEST/wheels" nibabel==5.4.2
fi
# The kernel cache of an sm_90 device (H100 / H200, CUDA 13.0 driver), so that a fresh device
# machine reads its families rather than compiling them (`examples/warm_cache.rs`; skipped where
# NVRTC is missing here: the device then compiles as before).
cargo build --release --example warm_cache
rm -rf "$DEST/cache"
XDG_CACHE_HOME="$DEST/cache" "$t/release/examples/warm_cache" sm_90 13000 > /dev/null ||
  { echo "build.sh: no kernel cache (NVRTC?); the device compiles the families" >&2; rm -rf "$DEST/cache"; }
ls -la "$DEST"
