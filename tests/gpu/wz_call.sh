#!/usr/bin/env bash
# One device call for the z-pair wgmma convs (issue 31, kernels/conv_wgmma_z.cu): the wgmma
# kernels against float64 (`it cuda::ops::conv_wgmma`), then every halo / wgmma variant on K1
# and the other halo layers (`bench_halo_variants`, RESULT lines), then (AB=1) W1 / W2 against
# eager and old binary against new (tests/gpu/ab.py; bench_old in the bundle). Here: `bash tests/gpu/build.sh
# && bash tests/gpu/bench_bundle.sh`; there, carrying `.dev/gb.tar.xz`: `bash tests/gpu/wz_call.sh`.
#   ONLY=K1,64->32 (bench layers), TESTS=0 (skip the tests; WZ_TESTS which of cases, persistent, slices; TEST_S their timeout), BENCH=0 (skip the layers), AB=1 (the
#   A/B too, ROUNDS=3 alternations), NCU=1 (ncu on K1,
#   NCU_K=kernel names, comma-separated).
set -u
. "$(dirname "$0")/call_env.sh"
if [ "${TESTS:-1}" = 1 ]; then
  # The three tests in processes of their own, side by side (one GPU; the float64 references
  # spread over the CPU cores).
  for t in ${WZ_TESTS:-cases persistent slices}; do
    timeout "${TEST_S:-420}" "$G/it" "cuda::ops::conv_wgmma::conv_wgmma_$t" --nocapture > "$OUT/t_wgmma_$t.log" 2>&1 &
  done
  wait
  el "TEST conv_wgmma done"
  for t in ${WZ_TESTS:-cases persistent slices}; do
    grep -E "conv_wz|test result|panicked|FAILED" "$OUT/t_wgmma_$t.log" | tail -24
  done
fi
if [ "${BENCH:-1}" = 1 ]; then
  VOXTILE_BENCH_ONLY=${ONLY:-K1} timeout 200 "$G/it" bench_halo_variants --nocapture --test-threads=1 > "$OUT/b_halo.log" 2>&1
  el "bench_halo_variants rc $?"
  grep -E "^RESULT|panicked" "$OUT/b_halo.log" | cut -c1-160
fi
if [ "${AB:-0}" = 1 ]; then
  BUNDLE=$G OUT=$OUT timeout 200 bash tests/gpu/bench.sh --only w1,w2 --modes eager --deadline 190 > /dev/null 2>&1
  el "bench w1,w2 rc $?"
  tail -4 "$OUT/bench/bench.md"
  timeout 150 python3 tests/gpu/ab.py "$G/bench_old" "$G/bench" /tmp/voxtile-bench "${ROUNDS:-3}" > "$OUT/ab.log" 2>&1
  el "ab rc $?"
  cut -c1-300 "$OUT/ab.log"
fi
# ncu on K1's first launch of each kernel in NCU_K (comma-separated; default conv_wz_c32_y16_h2):
# the full set into ncu_KERNEL.ncu-rep, and its tensor-pipe, issue, stall and shared-memory
# metrics printed from the raw page.
if [ "${NCU:-0}" = 1 ] && command -v ncu > /dev/null; then
  for k in $(echo "${NCU_K:-conv_wz_c32_y16_h2}" | tr , ' '); do
    VOXTILE_BENCH_ONLY=K1 timeout 150 ncu -k "$k" --launch-count 1 --set full -o "$OUT/ncu_$k" \
      "$G/it" bench_halo_variants --nocapture --test-threads=1 > "$OUT/ncu_$k.log" 2>&1
    el "ncu $k rc $?"
    ncu -i "$OUT/ncu_$k.ncu-rep" --page raw --csv > "$OUT/ncu_$k.csv" 2>/dev/null
    python3 - "$OUT/ncu_$k.csv" <<'PY'
import csv, re, sys
rows = list(csv.reader(open(sys.argv[1])))
if len(rows) >= 3:
    pat = re.compile(r"gpu__time_duration.sum|pipe_tensor.*(pct|active)|issue_active.avg.pct|inst_executed.sum$|"
                     r"warp_latency_issue_stalled_.*ratio|pipe_shared|mem_shared.*(pct|sum)|bank_conflict|"
                     r"warps_active.avg.per_cycle|sm__throughput.avg.pct")
    for name, unit, val in zip(rows[0], rows[1], rows[2]):
        if pat.search(name) and val not in ("", "0", "0.00"):
            print(f"{name} [{unit}] {val}")
PY
  done
fi
