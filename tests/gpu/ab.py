"""Old binary against new on the GPU, same device session: W1 and W2 (the nets and volume bench.py
exported into OUT), each binary run ROUNDS times alternately, medians compared; labels compared too.

usage: python3 tests/gpu/ab.py OLD_BENCH NEW_BENCH OUT [ROUNDS]   (after bench.py NEW_BENCH OUT w1,w2)
"""
import json, subprocess, sys
import numpy as np

old, new, out = sys.argv[1:4]
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
rows = []
for w in ("w1", "w2"):
    times = {"old": [], "new": []}
    for r in range(rounds):
        for who, b in (("old", old), ("new", new)) if r % 2 == 0 else (("new", new), ("old", old)):
            lab = f"{out}/ab_{w}_{who}.npy"
            p = subprocess.run([b, f"{out}/{w}.onnx", f"{out}/vol.npy", "128", "0.5", "4", "5", "cuda", lab],
                               capture_output=True, text=True)
            if p.returncode != 0:
                print(json.dumps(dict(workload=w, who=who, error=p.stderr.strip().splitlines()[-3:])), flush=True)
                continue
            times[who].append(json.loads(p.stdout.strip().splitlines()[-1])["median_s"])
    lo, ln = np.load(f"{out}/ab_{w}_old.npy"), np.load(f"{out}/ab_{w}_new.npy")
    mo, mn = float(np.median(times["old"])), float(np.median(times["new"]))
    row = dict(workload=w, old_s=round(mo, 4), new_s=round(mn, 4), new_over_old=round(mn / mo, 4),
               old_runs=times["old"], new_runs=times["new"], label_agreement=float((lo == ln).mean()))
    rows.append(row)
    print(json.dumps(row), flush=True)
json.dump(rows, open(f"{out}/ab.json", "w"), indent=1)
