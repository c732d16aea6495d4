#!/usr/bin/env bash
# On the GPU machine: the converters' end-to-end check (scripts/test_exports.py: two nnU-Net results
# folders and a MONAI bundle (scripts/test_bundle.py), random weights, converted, segmented by the
# carried release `voxtile`, compared with PyTorch + MONAI), once with `--device cuda` and once with
# `--device cpu`. BUNDLE (default .dev/ex, from tests/gpu/exports_bundle.sh) holds voxtile and wheels/.
#   BUNDLE=.dev/ex bash tests/gpu/exports.sh [cuda,cpu]
# PY (default python3) and SITE (default /tmp/site, where the wheels go) let it run elsewhere too.
# Results: $OUT/exports/exports_{cuda,cpu}.json (the agreement figures and the bars they are held to),
# exports_{cuda,cpu}.log, summary.txt. Exit status 1 when a device's check fails or does not run.
set -uo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
bundle="${BUNDLE:-$here/.dev/ex}"
devices="${1:-cuda,cpu}"
py="${PY:-python3}" site="${SITE:-/tmp/site}"
"$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$bundle"/wheels/*.whl || exit 1
export PYTHONPATH="$site" LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
out="${OUT:-/tmp/out}/exports"
mkdir -p "$out"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo "no GPU"; } | tee "$out/summary.txt"
status=0
for dev in ${devices//,/ }; do
  work="/tmp/voxtile-exports-$dev"
  rm -rf "$work"
  "$py" "$here/scripts/test_exports.py" "$bundle/voxtile" --device "$dev" --keep "$work" \
    --json "$out/exports_$dev.json" 2>&1 | tee "$out/exports_$dev.log"
  rc=${PIPESTATUS[0]}
  echo "$dev: exit $rc, $(tail -n 1 "$out/exports_$dev.log")" | tee -a "$out/summary.txt"
  [ "$rc" -eq 0 ] || status=1
done
exit $status
