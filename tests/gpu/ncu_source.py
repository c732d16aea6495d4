"""Where a kernel's warps stall, from the SASS source page `profile_call.sh`'s NCU_SRC writes.

    python3 tests/gpu/ncu_source.py p/src_w1_conv_wz_c32_y16_h2_st.csv [TOP]

Prints the samples' stall reasons over the whole kernel, then the runs of instructions with one
execution count (a loop body or a straight stretch, which tells the MMA warps' code from the
helper's by how often it runs) that hold at least 0.5% of the samples, then the TOP (25)
instructions by samples with their three main reasons.
"""

import csv
import sys
from collections import Counter


def main(path, top=25):
    rows = list(csv.reader(open(path)))
    head = rows[1]
    col = {h: i for i, h in enumerate(head)}
    data = rows[2:]
    reasons = [h for h in head if h.startswith("stall_") and "(Not" not in h]

    def num(r, h):
        return int(r[col[h]] or 0)

    def samples(r):
        return num(r, "Warp Stall Sampling (All Samples)")

    def execs(r):
        return num(r, "Instructions Executed")

    def op(r):
        words = r[col["Source"]].split()
        return (words[1] if words and words[0].startswith("@") else words[0]).split(".")[0] if words else ""

    total = sum(samples(r) for r in data)
    print(f"{path}: {len(data)} instructions, {total} samples")
    by_reason = Counter({h[6:]: sum(num(r, h) for r in data) for h in reasons})
    print("  " + ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in by_reason.most_common(10)))
    runs = []
    for i, r in enumerate(data):
        if runs and runs[-1]["exec"] == execs(r):
            run = runs[-1]
        else:
            run = {"first": i, "exec": execs(r), "samples": 0, "ops": Counter()}
            runs.append(run)
        run["last"] = i
        run["samples"] += samples(r)
        run["ops"][op(r)] += 1
    print("runs of one execution count (first-last, executed, share of the samples, opcodes):")
    for run in runs:
        if run["samples"] >= 0.005 * total:
            ops = ", ".join(f"{k} {v}" for k, v in run["ops"].most_common(5))
            print(f"  {run['first']:5d}-{run['last']:5d} x{run['exec']:<8d} {100 * run['samples'] / total:5.1f}%  {ops}")
    print(f"top {top} instructions:")
    for i, r in sorted(enumerate(data), key=lambda ir: -samples(ir[1]))[:top]:
        why = sorted(((num(r, h), h[6:]) for h in reasons), reverse=True)[:3]
        why = ", ".join(f"{k} {v}" for v, k in why if v)
        print(f"  {i:5d} {100 * samples(r) / total:5.1f}% x{execs(r):<8d} {r[col['Source']].strip()[:56]:56s} {why}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 25)
