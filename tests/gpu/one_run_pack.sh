#!/usr/bin/env bash
# Packs what tests/gpu/one_run.sh needs into two archives that each fit a device call beside the
# working tree (a call carries 64 MiB in all; the tree is ~47 MB): the bench bundle and the suite.
# Run after tests/gpu/build.sh (and bench_bundle.sh):
#   bash tests/gpu/one_run_pack.sh [SRC=.dev/gpu] [GB=.dev/gb]
#     ->  .dev/one_bench.tar.xz, .dev/one_suite.tar.xz, .dev/one_fixtures.tar.xz
# The sliding-window fixtures (10 MB, which `it cuda::fixtures::` requires) go in a third archive for a third
# call, with the two models they run (so the archive alone serves `issue_bench_bg.sh wait`, which has no
# suite archive); MeshNet (unknown licence) stays behind (cuda::fixtures skips it).
set -euo pipefail
SRC=${1:-.dev/gpu}
GB=${2:-.dev/gb}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/suite/shared/fixtures" "$tmp/bench"
for f in it cuda_stream plan_gpu voxtile_lib; do
  cp "$SRC/$f" "$tmp/suite/"
done
cp -r "$SRC/shared/fixtures/models" "$tmp/suite/shared/fixtures/"
cp -r "$GB" "$tmp/bench/gb"
rm -f "$tmp/bench/gb/it" "$tmp/bench/gb/bench_old"   # one_run.sh copies the suite's it in
tar -cf - -C "$tmp/bench" gb | xz -T2 -6 > .dev/one_bench.tar.xz
tar -cf - -C "$tmp/suite" . | xz -T2 -6 > .dev/one_suite.tar.xz
tar -cf - -C "$SRC/shared/fixtures" sliding_window models/nnunet_small.onnx models/monai_unet_small.onnx | xz -T2 -6 > .dev/one_fixtures.tar.xz
ls -la .dev/one_bench.tar.xz .dev/one_suite.tar.xz .dev/one_fixtures.tar.xz
