#!/usr/bin/env bash
# One device call for issue 31's record: its bench (K1, W3, W2, W1 against eager and compile
# default, tests/gpu/bench.sh), then W3's process taken apart (tests/gpu/stamp.py: each debug line
# with its time since the spawn, and the exit). Here: `bash tests/gpu/build.sh && bash
# tests/gpu/bench_bundle.sh`; there, carrying `.dev/gb.tar.xz`: `bash tests/gpu/issue_call.sh`.
#   BENCH=0 (skip the bench; W3's split needs its volume and export in /tmp/voxtile-bench),
#   ONLY=k1,w3,w2,w1, DEADLINE=400 (seconds for the bench), W3_RUNS=3.
set -u
. "$(dirname "$0")/call_env.sh"
W=/tmp/voxtile-bench
if [ "${BENCH:-1}" = 1 ]; then
  BUNDLE=$G OUT=$OUT timeout $((${DEADLINE:-400} + 30)) bash tests/gpu/bench.sh --only "${ONLY:-k1,w3,w2,w1}" \
    --modes eager,default --mode-timeout 200 --deadline "${DEADLINE:-400}" > /dev/null 2>&1
  el "bench rc $?"
  cat "$OUT/bench/bench.md"
fi
if [ -e "$W/ct512.nii.gz" ] && [ -e "$W/w1.onnx" ]; then
  export XDG_CACHE_HOME=/tmp/w3-cache
  for i in $(seq 0 "${W3_RUNS:-3}"); do
    # Run 0 fills the kernel cache (cold); the others are warm, as the bench's W3.
    python3 tests/gpu/stamp.py "$G/voxtile" segment "$W/ct512.nii.gz" --model "$W/w1.onnx" -o "$W/w3_split.nii.gz" \
      --roi 128 --overlap 0.5 --batch 4 --normalize zscore --device cuda --force -vv \
      --report "$OUT/w3_report_$i.json" > "$OUT/w3_split_$i.log" 2>&1
    el "w3 split $i: $(tail -1 "$OUT/w3_split_$i.log")"
  done
  cut -c1-220 "$OUT/w3_split_${W3_RUNS:-3}.log"
  python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get('seconds'))" "$OUT/w3_report_${W3_RUNS:-3}.json"
fi
