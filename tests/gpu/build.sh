#!/usr/bin/env bash
# Builds everything the GPU machine runs (it has no cargo) into DEST (default .dev/gpu), which the
# device call carries: the GPU test binaries (cuda_ops, cuda_kernels_compile, cuda_pipeline,
# gpu_fixtures, half, voxtile_lib), the release `voxtile` and `bench` binaries, a copy of the shared
# fixtures (../shared does not travel) and the peer's wheels. Then, there: tests/gpu/all.sh.
set -euo pipefail
DEST=${1:-.dev/gpu}
mkdir -p "$DEST"
cargo test --no-run --message-format=json --lib --test cuda_ops --test cuda_kernels_compile --test cuda_pipeline --test gpu_fixtures --test plan_gpu --test trust_plan --test ops_pad --test cuda_eltwise --test archs --test cuda_tensor --test cuda_attention --test half 2>/dev/null |
  python3 -c '
import json, sys, shutil
dest = sys.argv[1]
for line in sys.stdin:
    m = json.loads(line)
    kind = m.get("target", {}).get("kind", [""])[0]
    if m.get("reason") == "compiler-artifact" and m.get("executable") and kind in ("lib", "test") and m["target"]["name"] in ("cuda_ops", "cuda_kernels_compile", "cuda_pipeline", "gpu_fixtures", "plan_gpu", "trust_plan", "ops_pad", "cuda_eltwise", "archs", "cuda_tensor", "cuda_attention", "half", "voxtile"):
        name = "voxtile_lib" if kind == "lib" else m["target"]["name"]
        shutil.copy(m["executable"], f"{dest}/{name}")
        print(name, m["executable"])
' "$DEST"
cargo build --release --bin voxtile --example bench
cp target/release/voxtile target/release/examples/bench "$DEST/"
# Debug info only makes the transfer larger.
for f in "$DEST"/cuda_ops "$DEST"/cuda_kernels_compile "$DEST"/cuda_pipeline "$DEST"/gpu_fixtures "$DEST"/plan_gpu "$DEST"/trust_plan "$DEST"/ops_pad "$DEST"/cuda_eltwise "$DEST"/archs "$DEST"/cuda_tensor "$DEST"/cuda_attention "$DEST"/half "$DEST"/voxtile_lib "$DEST"/voxtile "$DEST"/bench; do strip --strip-all "$f"; done
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
ls -la "$DEST"
