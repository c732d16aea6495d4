#!/usr/bin/env bash
# One device call that checks a change and, where it holds, starts issue 31's bench on the same
# machine (a fresh start costs minutes of the session's device time): `profile_call.sh` with the
# caller's settings, then `issue_bench_bg.sh start` (waiting the rest of the call) only where
# every TESTS entry passed and, with GATE, the profile's GATE variant ran GATE_MIN (1.0) times
# slower than the default or more (the default, i.e. the change, is the faster); without GATE
# (NETS=-) the tests alone decide. Then `issue_bench_bg.sh wait` at once. Carrying
# `.dev/gb.tar.xz`, e.g.
#   NETS=w1 BATCHES=4 PROFILE_BATCHES=4 VOXTILE_PROFILE_ONLY=runs GATE="by runs of voxels" \
#   TESTS="it:cuda::ops::norm_stats::shifted_norm" bash tests/gpu/profile_then_bench.sh
#   (CALL_S: the call's seconds, default 575)
set -u
start=$(date +%s)
log=/tmp/profile_then_bench.log
bash "$(dirname "$0")/profile_call.sh" 2>&1 | tee "$log"
fails=$(grep -E "^\[[0-9]+ s\] TEST " "$log" | grep -vc " rc 0: ")
# No GATE (NETS=-: the tests alone): the tests decide.
ratio=$(grep -F "${GATE:-RESULT profile}" "$log" | grep "RESULT profile" |
  sed -n 's/.*(\([0-9.]*\)x).*/\1/p' | head -1)
if [ "$fails" != 0 ] || { [ -n "${GATE:-}" ] && { [ -z "$ratio" ] ||
  ! python3 -c "import sys; sys.exit(0 if float('$ratio') >= float('${GATE_MIN:-1.0}') else 1)"; }; }; then
  echo "GATE not met (failed tests $fails, '${GATE:-}' at ${ratio:-none}x): no bench"
  exit 1
fi
echo "GATE met ('${GATE:-}' at ${ratio}x): starting the bench"
WAIT=$((${CALL_S:-575} - ($(date +%s) - start))) bash "$(dirname "$0")/issue_bench_bg.sh" start
