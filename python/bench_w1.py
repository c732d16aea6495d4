"""W1 through the Python package against the Rust bench (examples/bench.rs), same ONNX, volume and
settings (roi 128, overlap 0.5, batch 4, CUDA), one after the other on the same GPU: issue 34's
"model.segment within 5% of the Rust bench" line. Prints one JSON line (medians, ratio, whether the
labels are the same) for BENCHMARKS.md.

usage, on the GPU machine (no cargo there: the wheel and `bench` are built here, see the report):
  pip install --no-deps --no-index .whl/voxtile-*.whl
  python3 tests/gpu/bench_peer.py prep /tmp/work w1     # vol.npy + w1.onnx, as bench.py makes them
  python3 python/bench_w1.py /tmp/work .dev/gpu/bench [--reps 5]
"""
import argparse
import json
import statistics
import subprocess
import time

import numpy as np

import voxtile


def rust(bench, work, reps):
    """examples/bench.rs: its median seconds and labels."""
    labels = f"{work}/w1_rust_labels.npy"
    out = subprocess.run([bench, f"{work}/w1.onnx", f"{work}/vol.npy", "128", "0.5", "4", str(reps),
                          "cuda", labels], capture_output=True, text=True, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return r["median_s"], r["first_s"], np.load(labels)


def python(work, reps):
    """voxtile.Model.segment on the same array (host volume in, labels back on the host, as the
    bench times the engine): the first run (kernels compiled or loaded) apart, then the median."""
    vol = np.load(f"{work}/vol.npy")
    model = voxtile.Model(f"{work}/w1.onnx", device="cuda", roi=128, overlap=0.5, batch=4)
    t = time.perf_counter()
    labels = model.segment(vol)
    first = time.perf_counter() - t
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        labels = model.segment(vol)
        times.append(time.perf_counter() - t)
    return statistics.median(times), first, labels, model.info["device"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("work", help="the folder with vol.npy and w1.onnx")
    ap.add_argument("bench", help="the release examples/bench binary")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    # Twice each, alternating, so that neither side gets the warmer GPU.
    runs = {"rust": [], "python": []}
    for _ in range(2):
        r_med, r_first, r_labels = rust(a.bench, a.work, a.reps)
        p_med, p_first, p_labels, device = python(a.work, a.reps)
        runs["rust"].append(r_med)
        runs["python"].append(p_med)
    rust_s, py_s = min(runs["rust"]), min(runs["python"])
    print(json.dumps({
        "device": device, "rust_median_s": rust_s, "python_median_s": py_s,
        "ratio": py_s / rust_s, "within_5_percent": py_s <= 1.05 * rust_s,
        "rust_runs": runs["rust"], "python_runs": runs["python"],
        "first_s": {"rust": r_first, "python": p_first},
        "labels_equal": bool(np.array_equal(r_labels.astype(np.uint16), p_labels)),
    }))


if __name__ == "__main__":
    main()
