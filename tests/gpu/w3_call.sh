#!/usr/bin/env bash
# One device call for W3's process (issue 31): the W1 export and the 512x512x128 CT made as
# bench.py makes them, then binaries of voxtile alternated on W3's command under
# tests/gpu/stamp.py (each `-vv` line with its time since the spawn, then the exit's wall);
# then (TESTS=1) the wgmma conv tests as wz_call.sh runs them. Here: `bash tests/gpu/build.sh &&
# bash tests/gpu/bench_bundle.sh`, other binaries copied into .dev/gb and the tar remade; there,
# carrying `.dev/gb.tar.xz`: `BINS="voxtile_old voxtile" bash tests/gpu/w3_call.sh`.
#   BINS (in /tmp/gb; default voxtile), ROUNDS=4, TESTS=1 (WZ_TESTS: which of wz_call.sh's).
set -u
. "$(dirname "$0")/call_env.sh"
W=/tmp/voxtile-bench
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$G"/wheels/*.whl
mkdir -p "$W"
# (Made already when a bench ran before in the same call.)
if [ ! -e "$W/w1.onnx" ] || [ ! -e "$W/ct512.nii.gz" ]; then
PYTHONPATH=/tmp/site timeout 200 python3 tests/gpu/bench_peer.py prep "$W" w1 > "$OUT/prep.log" 2>&1
el "prep rc $? ($(tail -c 200 "$OUT/prep.log"))"
PYTHONPATH=/tmp/site timeout 120 python3 "$G/wheels/make_ct512.py" "$G/shared/fixtures/volumes/ts_ct_512x512x20.nii.gz" "$W/ct512.nii.gz" > "$OUT/ct.log" 2>&1
el "make_ct512 rc $?"
fi
export XDG_CACHE_HOME=/tmp/w3-cache
run() {  # binary, log
  python3 tests/gpu/stamp.py "$G/$1" segment "$W/ct512.nii.gz" --model "$W/w1.onnx" -o "$W/w3_$1.nii.gz" \
    --roi 128 --overlap 0.5 --batch 4 --normalize zscore --device cuda --force -vv \
    --report "$W/w3_$1.json" > "$2" 2>&1
}
mkdir -p "$OUT/w3"
for b in ${BINS:-voxtile}; do run "$b" "$OUT/w3/cold_$b.log"; el "$b cold: $(tail -1 "$OUT/w3/cold_$b.log")"; done
for r in $(seq 1 "${ROUNDS:-4}"); do
  for b in ${BINS:-voxtile}; do
    run "$b" "$OUT/w3/${b}_$r.log"
    echo "$b $r $(tail -1 "$OUT/w3/${b}_$r.log" | cut -c1-90) $(python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['seconds']; print(' '.join(f'{k} {v:.3f}' for k, v in s.items() if v))" "$W/w3_$b.json")"
  done
done | tee "$OUT/w3/rounds.txt"
for b in ${BINS:-voxtile}; do
  echo "== $b, round ${ROUNDS:-4}"; grep -v "cubin from" "$OUT/w3/${b}_${ROUNDS:-4}.log" | cut -c1-200
done
PYTHONPATH=/tmp/site python3 - "$W" ${BINS:-voxtile} <<'PY'
import sys, nibabel as nib, numpy as np
w, bins = sys.argv[1], sys.argv[2:]
ref = np.asarray(nib.load(f"{w}/w3_{bins[0]}.nii.gz").dataobj)
for b in bins[1:]:
    print(f"labels {b} vs {bins[0]}: {(np.asarray(nib.load(f'{w}/w3_{b}.nii.gz').dataobj) == ref).mean():.6f} equal")
PY
if [ "${TESTS:-1}" = 1 ]; then
  BENCH=0 WZ_TESTS="${WZ_TESTS:-cases persistent slices}" bash tests/gpu/wz_call.sh
fi
# One file back (a call returns few): every log in all.tgz.
tar -czf /tmp/all.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/all.tgz "$OUT/"
