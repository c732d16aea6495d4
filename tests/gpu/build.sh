#!/usr/bin/env bash
# Builds the GPU test binaries on the build machine and copies them to DEST (default .dev/cuda),
# named cuda_ops, cuda_kernels_compile, cuda_pipeline and voxtile_lib, for tests/gpu/run.sh on the GPU machine.
set -euo pipefail
DEST=${1:-.dev/cuda}
mkdir -p "$DEST"
cargo test --no-run --message-format=json --lib --test cuda_ops --test cuda_kernels_compile --test cuda_pipeline 2>/dev/null |
  python3 -c '
import json, sys, shutil
dest = sys.argv[1]
for line in sys.stdin:
    m = json.loads(line)
    kind = m.get("target", {}).get("kind", [""])[0]
    if m.get("reason") == "compiler-artifact" and m.get("executable") and kind in ("lib", "test") and m["target"]["name"] in ("cuda_ops", "cuda_kernels_compile", "cuda_pipeline", "voxtile"):
        name = "voxtile_lib" if kind == "lib" else m["target"]["name"]
        shutil.copy(m["executable"], f"{dest}/{name}")
        print(name, m["executable"])
' "$DEST"
cp tests/gpu/run.sh "$DEST/run.sh"
# Debug info only makes the transfer larger.
for f in "$DEST"/cuda_ops "$DEST"/cuda_kernels_compile "$DEST"/cuda_pipeline "$DEST"/voxtile_lib; do strip --strip-debug "$f"; done
ls -la "$DEST"
