#!/usr/bin/env bash
# The trust issue's GPU side, on the GPU machine after tests/gpu/build.sh: the planner keeps the
# model's window on CUDA too (a tiny budget is refused, not a thinner window), the OOM retry
# halves only the batch (plan_gpu), NaN outputs are counted, and the acceptance checks' CLI cases
# on --device cuda. Writes $OUT/trust_gpu.log; prints PASS/FAIL lines.
set -u
DIR=${1:-.dev/gpu}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/voxtile-cache}
LOG=${OUT:-/tmp}/trust_gpu.log
: > "$LOG"
T=$(mktemp -d)
VT="$DIR/voxtile"
check() { # name, expected rc (or "0|1"), command...
  local name=$1 want=$2; shift 2
  "$@" > "$T/out" 2> "$T/err"; local rc=$?
  { echo "=== $name rc=$rc"; tail -3 "$T/err"; } >> "$LOG"
  if [[ "|$want|" == *"|$rc|"* ]] && ! grep -q "panicked" "$T/err"; then echo "PASS $name"; else echo "FAIL $name (rc $rc): $(tail -1 "$T/err")"; fi
}
S=data/mni_t1_128.nii.gz; M=data/deepbrain.onnx
check "cuda default run" 0 "$VT" segment $S -m $M -o "$T/ref.nii.gz" --device cuda
check "cuda 32MiB budget refused (window kept)" 1 "$VT" segment $S -m $M -o "$T/small.nii.gz" --device cuda --memory-budget 32MiB
check "cuda plan 32MiB refused" 1 "$VT" plan -m $M --volume 128x128x128 --device cuda --memory-budget 32MiB
check "cuda plan absurd volume" 1 timeout 10 "$VT" plan -m $M --volume 18446744073709551615x2x2 --device cuda
check "cuda injected OOM at batch 1 is an error" 1 env VOXTILE_INJECT_OOM=1 "$VT" segment $S -m $M -o "$T/oom.nii.gz" --device cuda --batch 1
check "cuda report + logits staged together" 0 "$VT" segment $S -m $M -o "$T/r.nii.gz" --device cuda --logits "$T/l.nii.gz" --report "$T/r.json"
check "cuda tta + preview + probabilities" 0 "$VT" segment $S --tta 0 -m $M -o "$T/t.nii.gz" --device cuda --preview "$T/t.png" --probabilities "$T/p.nii.gz"
ls "$T" >> "$LOG"
t=trust::plan::nan_outputs_are_counted_on_gpu
[ -x "$DIR/it" ] && { "$DIR/it" --test-threads=1 --exact $t >> "$LOG" 2>&1 && echo "PASS $t" || echo "FAIL $t"; }
