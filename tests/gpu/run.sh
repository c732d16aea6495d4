#!/usr/bin/env bash
# Runs the CUDA GPU suite on a machine with an NVIDIA GPU, from prebuilt test binaries (it builds
# nothing: the GPU machine has no cargo). On the build machine:
#   tests/gpu/build.sh            # -> .dev/gpu/{it,cuda_stream,plan_gpu,voxtile_lib,voxtile,bench}
# then on the GPU machine, from the repository root:
#   tests/gpu/run.sh [DIR]        # DIR defaults to .dev/gpu
# Needs libcuda + libnvrtc (LD_LIBRARY_PATH=/usr/local/cuda/lib64) and CUDA headers
# (/usr/local/cuda/include, or VOXTILE_CUDA_INCLUDE). Prints a table of RESULT lines last.
# SANITIZE=1 also runs the op tests (not the benchmark) under compute-sanitizer memcheck.
set -u
DIR=${1:-.dev/gpu}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export VOXTILE_REQUIRE_GPU=1 VOXTILE_REQUIRE_NVRTC=1
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/voxtile-cache}
LOG=${OUT:-/tmp}/cuda_suite.log
: > "$LOG"
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader | tee -a "$LOG"
status=0
run() {
  echo "=== $*" | tee -a "$LOG"
  "$@" >> "$LOG" 2>&1
  local rc=$?
  echo "=== rc $rc" | tee -a "$LOG"
  [ $rc -eq 0 ] || status=1
}
# `it` is the one integration binary (tests/it): its tests are picked by path (filters OR).
# The op-level suite: kernel compile, lib unit tests, the CUDA op families (tests/it/cuda/ops, the
# long part, ~5.5 min).
long_part() {
run "$DIR/it" --nocapture cuda::kernels_compile::
run "$DIR/voxtile_lib" --test-threads=1 backend::cuda
# First run fills the PTX cache, the second must load every family from it.
run "$DIR/it" --test-threads=1 --nocapture cuda::ops::
run "$DIR/it" --test-threads=1 --nocapture cuda::ops::conv::conv_transpose_variants
}
# Whole passes and op groups on the GPU.
pass_part() {
# The streamed sliding-window pipeline (vs f64, device peak vs D, OOM retry, stage overlap).
[ -x "$DIR/cuda_stream" ] && run "$DIR/cuda_stream" --test-threads=1 --nocapture
# The shared op-case table's CUDA half (tests/it/ops: activations, pointwise functions,
# broadcasting binaries and constants, Softmax, norms; `*_cuda_f16`) and Pad / Tile on the GPU.
run "$DIR/it" --test-threads=1 --nocapture _cuda_f16 ops::pad::cuda_
# Tensor ops of transformer nets (any rank) and the fused attention kernel against the CPU.
run "$DIR/it" --test-threads=1 --nocapture cuda::tensor:: cuda::attention::
# The architecture fixtures (tests/fixtures/archs) and the fp16 and bf16 model files against
# onnxruntime (tests/fixtures/half) on the GPU.
run "$DIR/it" --test-threads=1 --nocapture model::archs::architectures_on_the_gpu \
  model::half::half_models_on_the_gpu_match_onnxruntime
}
# The planner and the real fixtures.
model_part() {
# The planner's CUDA prediction against the launch list's buffers and the measured peak; OOM
# retry; bands along H under a tight budget.
[ -x "$DIR/plan_gpu" ] && VOXTILE_DATA_DIR="$PWD/data" VOXTILE_SHARED_DIR="$DIR/shared" run "$DIR/plan_gpu" --test-threads=1 --nocapture
# The real fixtures: PyTorch model outputs, MONAI sliding windows, deepbrain vs onnxruntime, MeshNet.
VOXTILE_SHARED_DIR="$DIR/shared" VOXTILE_DATA_DIR="$PWD/data" VOXTILE_REQUIRE_FIXTURES=1 run "$DIR/it" --test-threads=1 --nocapture cuda::fixtures::
}
# QUICK=1 skips the op-level suite and the op groups; LONG_LAST=1 runs the long part last (a run
# that may be cut by the device budget keeps the whole-pass tests).
# PARTS="long" (any of pass, model, long, in that order) runs only those parts.
if [ -n "${PARTS:-}" ]; then
  for part in $PARTS; do "${part}_part"; done
elif [ "${LONG_LAST:-0}" = 1 ]; then
  pass_part; model_part; long_part
else
  if [ "${QUICK:-0}" != 1 ]; then long_part; pass_part; fi
  model_part
fi
if [ "${SANITIZE:-0}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  run timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 "$DIR/it" --test-threads=1 --skip bench cuda::ops::
fi
echo "---------------- summary ----------------"
grep -E "RESULT|panicked|FAILED|failed|from the PTX cache|test result|NVRTC|seed" "$LOG" | grep -v "^\s*$" | sort | uniq -c | sort -k2 | sed 's/^ *//' | cut -c1-150
exit $status
