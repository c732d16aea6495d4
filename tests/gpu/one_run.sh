#!/usr/bin/env bash
# One bench invocation of every workload and peer mode plus the whole GPU suite, on one machine, in
# a run that outlasts the 10 minutes a device call may take: the run is started detached (setsid)
# and later calls poll it (the machine stays warm while calls follow each other).
#   call 1, carrying .dev/one_bench.tar.xz:  bash tests/gpu/one_run.sh start [ARCHIVE_DIR=.dev]
#   call 2, carrying .dev/one_suite.tar.xz:  bash tests/gpu/one_run.sh suite-ready; bash tests/gpu/one_run.sh poll 560
#   call 3, carrying .dev/one_fixtures.tar.xz: bash tests/gpu/one_run.sh fixtures-ready; bash tests/gpu/one_run.sh poll 540
#   later calls:                             bash tests/gpu/one_run.sh poll 540
# SUITE_ONLY=1 on `start` runs the suite alone (no bench archive, no bench): calls 2 and 3 as above.
# BENCH_ONLY=1 on `start` runs the bench alone (call 1, then polls); RUN_DIR (default /tmp/one_run)
# keeps a second run's results apart from the first's, on every subcommand.
# The bench runs first, alone on the GPU (no test may overlap the peers' autotuning), then the suite
# (tests/gpu/run.sh, its whole-pass tests first). Results in /tmp/one_run; `poll` packs them into
# $OUT/one_run.tgz and prints the tables when done. BENCH_ARGS replaces the bench's arguments (default
# below: every W1/W2 mode, W1 first so that nothing cuts its max-autotune compile, ~6-7 min on the
# H200; K1 last, by when the second call has brought the `it` test binary).
set -u
R=${RUN_DIR:-/tmp/one_run}
here="$(cd "$(dirname "$0")/../.." && pwd)"
case "${1:-}" in
start)
  mkdir -p $R /tmp/one_repo
  # A copy of the tree: the device's checkout is re-synced by every call.
  (cd "$here" && tar --exclude=./.dev --exclude=./.git --exclude=./target -cf - . | tar -xf - -C /tmp/one_repo)
  echo "${2:-$here/.dev}" > $R/archives
  if [ "${SUITE_ONLY:-0}" = 1 ]; then touch $R/suite_only; else cp "${2:-$here/.dev}/one_bench.tar.xz" $R/; fi
  [ "${BENCH_ONLY:-0}" = 1 ] && touch $R/bench_only
  RUN_DIR=$R BENCH_ARGS="${BENCH_ARGS:-}" setsid nohup bash /tmp/one_repo/tests/gpu/one_run.sh run > $R/run.log 2>&1 < /dev/null &
  echo "started; bash tests/gpu/one_run.sh poll SECONDS"
  ;;
suite-ready)
  cp "$(cat $R/archives)/one_suite.tar.xz" $R/ && touch $R/suite_ready
  ;;
fixtures-ready)
  cp "$(cat $R/archives)/one_fixtures.tar.xz" $R/ && touch $R/fixtures_ready
  ;;
run)
  cd /tmp/one_repo
  B=/tmp/one_repo/.dev/one; mkdir -p $B/gb
  [ -f $R/suite_only ] || tar -xJf $R/one_bench.tar.xz -C $B
  export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
  export XDG_CACHE_HOME=/tmp/voxtile-cache VOXTILE_REQUIRE_GPU=1 VOXTILE_REQUIRE_NVRTC=1
  T0=$(date +%s)
  st() { echo "$* at $(( $(date +%s) - T0 )) s" >> $R/times.log; }
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader > $R/gpu.txt
  st start
  # The suite archive comes with the second call; K1 (last in the bench) needs its `it`.
  [ -f $R/bench_only ] || ( for _ in $(seq 240); do
      if [ -f $R/suite_ready ]; then
        tar -xJf $R/one_suite.tar.xz -C $B && cp $B/it $B/gb/ && touch $R/suite_in; break
      fi; sleep 5; done ) &
  if [ ! -f $R/suite_only ]; then
  # shellcheck disable=SC2086
  OUT=$R BUNDLE=$B/gb bash tests/gpu/bench.sh --work /tmp/work ${BENCH_ARGS:---only w1,w2,w3,w4,k1 \
    --modes eager,default,reduce-overhead,max-autotune-no-cudagraphs --w4-modes eager --mode-timeout 900} \
    > $R/bench_run.log 2>&1
  echo "bench rc $?" >> $R/bench_run.log
  st bench done
  # Where W3's start goes: one more W3 call on the bench's warm kernel cache with the debug log
  # (context creation, each kernel family's image and module load, cubin or PTX).
  c=$(ls -d /tmp/work/vx-cache-* 2>/dev/null | head -1)
  if [ -n "$c" ] && [ -f /tmp/work/ct512.nii.gz ]; then
    XDG_CACHE_HOME=$c VOXTILE_LOG=voxtile=debug timeout 120 $B/gb/voxtile segment /tmp/work/ct512.nii.gz \
      --model /tmp/work/w1.onnx -o /tmp/work/vx_debug.nii.gz --roi 128 --overlap 0.5 --batch 4 \
      --normalize zscore --device cuda --force --report $R/w3_debug_report.json > $R/w3_debug.log 2>&1
    echo "w3 debug rc $?" >> $R/w3_debug.log
  fi
  st w3 debug done
  fi
  wait
  if [ -f $R/bench_only ]; then touch $R/done; exit 0; fi
  # The sliding-window fixtures (`it cuda::fixtures::` requires them) come with the third call.
  for _ in $(seq 60); do [ -f $R/fixtures_ready ] && break; sleep 5; done
  [ -f $R/fixtures_ready ] && mkdir -p $B/shared/fixtures && tar -xJf $R/one_fixtures.tar.xz -C $B/shared/fixtures
  st fixtures in
  # The whole-pass tests first: a run cut by the device budget loses the long op-level part.
  [ -f $R/suite_in ] && LONG_LAST=1 OUT=$R bash tests/gpu/run.sh $B > $R/suite_run.log 2>&1
  echo "suite rc $?" >> $R/suite_run.log
  st suite done
  touch $R/done
  ;;
poll)
  end=$(( $(date +%s) + ${2:-560} ))
  while [ ! -f $R/done ] && [ "$(date +%s)" -lt $end ]; do sleep 5; done
  tar --exclude='*/one_bench.tar.xz' --exclude='*/one_suite.tar.xz' --exclude='*/one_fixtures.tar.xz' \
    -czf "${OUT:-/tmp}/$(basename $R).tgz" -C "$(dirname $R)" "$(basename $R)"
  cat $R/times.log 2>/dev/null
  tail -3 $R/bench_run.log 2>/dev/null
  if [ -f $R/done ]; then
    tail -40 $R/suite_run.log; [ -f $R/bench/bench.md ] && cat $R/bench/bench.md; echo "ONE RUN DONE"
  fi
  ;;
*)
  sed -n '2,12p' "$0"; exit 2
  ;;
esac
