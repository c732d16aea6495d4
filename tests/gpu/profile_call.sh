#!/usr/bin/env bash
# One device call that says where W1's and W2's time and memory go (issue 31): the W1 and W2
# exports made as bench.py makes them, `bench` on each at several batches (median of REPS passes,
# device peak from the report), then `profile_models` (per-op times, fp16 against fp32 norm inputs)
# on each export at PROFILE_BATCHES. Here: `bash tests/gpu/build.sh && bash tests/gpu/bench_bundle.sh` (`TEST_BINS=1` for cuda_stream / plan_gpu TESTS);
# there, carrying `.dev/gb.tar.xz`: `bash tests/gpu/profile_call.sh`. Everything comes back in
# $OUT/all.tgz; the summary lines on stdout.
#   NETS (w1,w2; "-": the TESTS only), BATCHES ("1 2 4"), REPS (3), PROFILE_BATCHES ("4 2"), BINS (bench; "bench_old
#   bench" alternates two builds, each pass of ROUNDS (1) running every bin once per batch),
#   TESTS (BIN:FILTER entries run first, BIN one of the bundle's test binaries, e.g.
#   "it:cuda::ops::norm plan_gpu:"), TEST_S (seconds per test entry, default 200),
#   PROFILE_S (seconds per profile, default 150),
#   VOXTILE_PROFILE_ONLY (the profile's variants whose name holds one of its |-separated words),
#   NCU (a kernel-name regex: Nsight Compute's NCU_SECTIONS (speed of light, memory, compute,
#   occupancy, warp state, scheduler, launch) of the first NCU_COUNT (8) matching launches of
#   `profile_models` at batch 4 on each net of NCU_NET (w1; space-separated), into p/ncu_NET.txt,
#   NCU_S (240) seconds each; where ncu cannot read the counters it says so there),
#   NCU_EACH ("NET:REGEX ...": one ncu run per entry on the first launch whose name matches,
#   with the speed of light, occupancy and scheduler sections and the warps' stall reasons per
#   issued instruction, into p/ncu1_NET_NAME.txt, NCU_S seconds each; NETS must hold its nets,
#   whose exports it profiles),
#   NCU_SRC ("NET:REGEX ...": as NCU_EACH, the per-instruction warp-state samples instead
#   (SourceCounters): the report p/src_NET_NAME.ncu-rep and its SASS source page as CSV,
#   p/src_NET_NAME.csv, one row per instruction with its stall reasons)
set -u
. "$(dirname "$0")/call_env.sh"
W=/tmp/voxtile-bench
NETS=${NETS:-w1,w2}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$G"/wheels/*.whl
mkdir -p "$W" "$OUT/p"
for t in ${TESTS:-}; do
  bin=${t%%:*} filt=${t#*:}
  f="$OUT/p/t_${bin}_${filt//::/_}.log"
  timeout "${TEST_S:-200}" "$G/$bin" --test-threads=1 --nocapture $filt > "$f" 2>&1
  el "TEST $bin $filt rc $?: $(grep -E "^test result" "$f" | tail -1)"
  grep -E "panicked|FAILED|RESULT (convt|tile stats|window segments)" "$f" | head -30
done
if [ "$NETS" = - ]; then
  tar -czf /tmp/all.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/all.tgz "$OUT/"
  exit 0
fi
PYTHONPATH=/tmp/site timeout 240 python3 tests/gpu/bench_peer.py prep "$W" "$NETS" > "$OUT/p/prep.log" 2>&1
el "prep rc $?"
for round in $(seq 1 "${ROUNDS:-1}"); do
for n in ${NETS//,/ }; do
  for b in ${BATCHES:-1 2 4}; do
    for bin in ${BINS:-bench}; do
      f="$OUT/p/${bin}_${n}_b${b}_r$round.json"
      timeout 120 "$G/$bin" "$W/$n.onnx" "$W/vol.npy" 128 0.5 "$b" "${REPS:-3}" cuda - > "$f" 2> "$f.err"
      el "$bin $n batch $b round $round rc $?: $(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); p=r['report']; g=p.get('gpu') or {}; print(f\"median {r['median_s']:.4f} s, peak {p.get('peak_device_bytes',0)/2**30:.3f} GiB, predicted {((p.get('predicted_peak_bytes') or {}).get('device') or 0)/2**30:.3f}; pass {g.get('wall_ms',0):.1f} ms (setup {g.get('setup_ms',0):.2f}, compute {g.get('compute_ms',0):.1f})\")" "$f" 2>&1 | tail -1)"
    done
  done
done
done
# Nsight Compute, where the machine has it (NCU, NCU_EACH).
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
# ncu_net NET LOG OPTION...: Nsight Compute over `profile_models` on NET's export at batch 4,
# NCU_S seconds, its output into LOG.
ncu_net() {
  local n=$1 log=$2
  shift 2
  VOXTILE_PROFILE_ONNX="$W/$n.onnx:128:4" timeout "${NCU_S:-240}" "$ncu" --clock-control none "$@" \
    "$G/it" --test-threads=1 cuda::ops::bench::profile_models > "$log" 2>&1
}
if [ -n "${NCU:-}" ]; then
  secs=""
  for s in ${NCU_SECTIONS:-SpeedOfLight MemoryWorkloadAnalysis ComputeWorkloadAnalysis Occupancy WarpStateStats SchedulerStats LaunchStats}; do
    secs="$secs --section $s"
  done
  for n in ${NCU_NET:-w1}; do
    ncu_net "$n" "$OUT/p/ncu_$n.txt" -k "regex:$NCU" -c "${NCU_COUNT:-8}" $secs
    el "ncu $n rc $?: $(grep -c "Duration" "$OUT/p/ncu_$n.txt") kernels profiled"
  done
fi
for e in ${NCU_EACH:-}; do
  n=${e%%:*} k=${e#*:}
  f="$OUT/p/ncu1_${n}_${k//[^A-Za-z0-9_]/}.txt"
  ncu_net "$n" "$f" -k "regex:$k" -c 1 --section SpeedOfLight --section Occupancy --section SchedulerStats \
    --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio'
  el "ncu $n $k rc $?"
  grep -E "Duration|Throughput|stalled_.*ratio|Eligible" "$f" | sed 's/  */ /g' | head -40
done
for e in ${NCU_SRC:-}; do
  n=${e%%:*} k=${e#*:}
  f="$OUT/p/src_${n}_${k//[^A-Za-z0-9_]/}"
  ncu_net "$n" "$f.log" -k "regex:$k" -c 1 --section SourceCounters --section WarpStateStats \
    --section SpeedOfLight --import-source no -o "$f" -f
  el "ncu source $n $k rc $?"
  "$ncu" -i "$f.ncu-rep" --page source --csv --print-source sass > "$f.csv" 2> "$f.err"
  el "source page rc $? ($(wc -l < "$f.csv") lines)"
done
for n in ${NETS//,/ }; do
  for b in ${PROFILE_BATCHES:-4 2}; do
    f="$OUT/p/profile_${n}_b$b.log"
    VOXTILE_PROFILE_ONNX="$W/$n.onnx:128:$b" timeout "${PROFILE_S:-150}" "$G/it" --test-threads=1 --nocapture \
      cuda::ops::bench::profile_models > "$f" 2>&1
    el "profile $n batch $b rc $?"
    grep "RESULT" "$f" | head -40
  done
done
tar -czf /tmp/all.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/all.tgz "$OUT/"
