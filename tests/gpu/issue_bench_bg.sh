#!/usr/bin/env bash
# Issue 31's record as ONE bench.sh invocation with every peer mode BENCHMARKS.md names (eager,
# compile default, compile max-autotune-no-cudagraphs) for K1, W3, W2 and W1: longer than one
# device call may run (max-autotune's first passes: ~370 s for W1, ~250 s for W2). `start`
# launches it in a process session of its own, which outlives the call (the device README: such
# a process runs on until the machine goes back) and waits; `wait`, called at once after (within
# the machine's warm time, 30 s), waits on and prints it, its files into $OUT/bench. Carrying
# `.dev/gb.tar.xz`:
#   bash tests/gpu/issue_bench_bg.sh start   then   bash tests/gpu/issue_bench_bg.sh wait
#   (DEADLINE: the bench's seconds, default 1100; WAIT: seconds a call waits, default 570;
#   ONLY: the workloads, default k1,w3,w2,w1: `ONLY=w1` is W1 against every peer mode, ~500 s;
#   a `wait` carrying `.dev/one_fixtures.tar.xz` runs the sliding-window fixtures after the bench)
set -u
. "$(dirname "$0")/call_env.sh"
B=/tmp/issue_bench
case "${1:-}" in
start)
  rm -rf "$B"
  mkdir -p "$B"
  setsid nohup bash -c "BUNDLE=$G OUT=$B bash tests/gpu/bench.sh --only ${ONLY:-k1,w3,w2,w1} \
    --modes eager,default,max-autotune-no-cudagraphs --mode-timeout 480 --deadline ${DEADLINE:-1100}; \
    echo \$? > $B/done" > "$B/run.log" 2>&1 < /dev/null &
  el "bench started"
  ;;
wait) ;;
*)
  echo "usage: issue_bench_bg.sh start|wait" >&2
  exit 2
  ;;
esac
[ -d "$B" ] || { echo "issue_bench_bg.sh: no bench was started on this machine (a fresh one?)"; exit 1; }
while [ ! -e "$B/done" ] && [ $(($(date +%s) - t0)) -lt "${WAIT:-570}" ]; do
  sleep 10
done
tail -n 5 "$B/run.log"
if [ -e "$B/done" ]; then
  el "bench done rc $(cat "$B/done")"
  mkdir -p "$OUT/bench"
  cp -r "$B"/bench/. "$OUT/bench/" 2>/dev/null
  cat "$B/bench/bench.md"
  # Carried `.dev/one_fixtures.tar.xz` (one_run_pack.sh): the MONAI sliding-window fixtures'
  # test once the GPU is free, the suite's part a call without them leaves out.
  if [ -f .dev/one_fixtures.tar.xz ]; then
    mkdir -p /tmp/fx/fixtures && tar -xJf .dev/one_fixtures.tar.xz -C /tmp/fx/fixtures
    VOXTILE_SHARED_DIR=/tmp/fx VOXTILE_REQUIRE_FIXTURES=1 timeout 300 "$G/it" --test-threads=1 \
      --nocapture cuda::fixtures::sliding_window > "$OUT/bench/fixtures.log" 2>&1
    el "sliding-window fixtures rc $?: $(grep -E "^test result" "$OUT/bench/fixtures.log" | tail -1)"
  fi
else
  el "bench still running: call 'wait' again at once"
fi
