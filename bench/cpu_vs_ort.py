"""voxtile's CPU backend against onnxruntime (CPU provider) on the same nets and inputs, in one run.

Cases (each timed as the best of --reps runs, voxtile = the whole CLI process, ORT = inference only):
  c1     deepbrain, one 128^3 window (../shared trained_deepbrain fixture)
  c2     MeshNet 20 channels, one 256^3 window (../shared trained_meshnet fixture; local only, never
         copied into the repo)
  sw     the README sample (data/) resampled to 192x192x128, roi 128, overlap 0.5, gaussian:
         voxtile CLI whole process against ORT on the same 4 windows (inference only)
  scale  c2 with 1 and with all cores (RAYON_NUM_THREADS=1 / ORT intra_op_num_threads=1)
Before timing c1 and c2 the outputs are compared: voxtile's --logits against ORT's output, rel L2.

Run (from the repository root; onnxruntime from PyPI):
  python3 -m venv /tmp/ortvenv && /tmp/ortvenv/bin/pip install onnxruntime numpy nibabel onnx
  cargo build --release
  /tmp/ortvenv/bin/python bench/cpu_vs_ort.py target/release/voxtile ../shared/fixtures [--reps 3] [--cases c1,c2,sw,scale]
"""
import argparse, os, subprocess, tempfile, time
import numpy as np, nibabel as nib, onnxruntime as ort

p = argparse.ArgumentParser()
p.add_argument("voxtile"); p.add_argument("fixtures")
p.add_argument("--reps", type=int, default=3)
p.add_argument("--cases", default="c1,c2,sw,scale")
a = p.parse_args()
cases = a.cases.split(",")
tmp = tempfile.mkdtemp(prefix="vx_cpu_bench_")
# The cores this process may use (taskset / cgroup affinity), not the machine's count.
ncpu = len(os.sched_getaffinity(0))

def session(model, threads=0):
    o = ort.SessionOptions(); o.intra_op_num_threads = threads or ncpu
    return ort.InferenceSession(model, o, providers=["CPUExecutionProvider"])

def ort_time(model, windows, threads=0):
    """Best of reps of running every window (one session, warmed up); returns (seconds, outputs)."""
    s = session(model, threads); n = s.get_inputs()[0].name
    outs = [s.run(None, {n: w})[0] for w in windows]; ts = []
    for _ in range(a.reps):
        t = time.perf_counter()
        for w in windows: s.run(None, {n: w})
        ts.append(time.perf_counter() - t)
    return min(ts), outs

def vx_run(vol, model, args, threads=None, extra=()):
    env = dict(os.environ)
    env["RAYON_NUM_THREADS"] = str(threads or ncpu)
    cmd = [a.voxtile, "segment", vol, "--model", model, "-o", f"{tmp}/o.nii.gz", "--force", "--device", "cpu", *args, *extra]
    t = time.perf_counter(); r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    return time.perf_counter() - t

def vx_time(vol, model, args, threads=None):
    return min(vx_run(vol, model, args, threads) for _ in range(a.reps))

def rel_l2(got, want):
    return float(np.linalg.norm((got - want).ravel()) / max(np.linalg.norm(want.ravel()), 1e-30))

def load(vol):
    return np.asarray(nib.load(vol).dataobj, dtype=np.float32)

def single(name, vol, model):
    x = load(vol); roi = ",".join(map(str, x.shape)); args = ["--roi", roi, "--overlap", "0", "--blend", "constant"]
    to, (y,) = ort_time(model, [x[None, None]])
    vx_run(vol, model, args, extra=["--logits", f"{tmp}/logits.nii"])
    lg = np.asarray(nib.load(f"{tmp}/logits.nii").dataobj, dtype=np.float32)  # x,y,z,channel
    err = rel_l2(np.moveaxis(lg.reshape(*x.shape, -1), -1, 0), y[0])
    tv = vx_time(vol, model, args)
    print(f"{name} {x.shape}: onnxruntime {to:.2f} s (inference only), voxtile CLI {tv:.2f} s (whole process) "
          f"-> {tv/to:.2f}x ORT; outputs rel L2 {err:.1e}", flush=True)
    return x, model, args

def windows(shape, roi, overlap):
    """MONAI's window starts per axis: step roi*(1-overlap), the last window pulled back to the end."""
    starts = []
    for s, r in zip(shape, roi):
        step = max(int(r * (1 - overlap)), 1); n = max(-(-(s - r) // step), 0) + 1
        starts.append(sorted({min(i * step, s - r) for i in range(n)}))
    return [(i, j, k) for i in starts[0] for j in starts[1] for k in starts[2]]

cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"machine: {ncpu} cores of {cpu}, load average {os.getloadavg()[0]:.2f} at start; onnxruntime {ort.__version__}", flush=True)
FX = a.fixtures
if "c1" in cases:
    single("C1 deepbrain 128^3", f"{FX}/trained_deepbrain/mni_t1_deepbrain_input128.nii.gz", f"{FX}/trained_deepbrain/deepbrain_trained.onnx")
c2 = (f"{FX}/trained_meshnet/t1_crop_meshnet_input.nii.gz", f"{FX}/trained_meshnet/meshnet20_trained.onnx")
if "c2" in cases:
    single("C2 meshnet20", *c2)
if "sw" in cases:
    img = nib.load("data/mni_t1_128.nii.gz"); v = load("data/mni_t1_128.nii.gz")
    # Linear resampling of x and y to 192 (z stays 128).
    def lin(v, axis, n):
        pos = np.linspace(0, v.shape[axis] - 1, n); i0 = np.floor(pos).astype(int); i1 = np.minimum(i0 + 1, v.shape[axis] - 1)
        f = (pos - i0).reshape([-1 if ax == axis else 1 for ax in range(v.ndim)])
        return np.take(v, i0, axis) * (1 - f) + np.take(v, i1, axis) * f
    big = lin(lin(v, 0, 192), 1, 192).astype(np.float32)
    vol = f"{tmp}/sample192.nii.gz"; nib.save(nib.Nifti1Image(big, img.affine), vol)
    model = "data/deepbrain.onnx"; roi = (128, 128, 128)
    ws = [big[None, None, i:i + 128, j:j + 128, k:k + 128] for i, j, k in windows(big.shape, roi, 0.5)]
    to, _ = ort_time(model, ws)
    tv = vx_time(vol, model, ["--roi", "128", "--overlap", "0.5", "--blend", "gaussian"])
    print(f"SW sample 192x192x128 roi 128 overlap 0.5 ({len(ws)} windows): onnxruntime {to:.2f} s (inference only), "
          f"voxtile CLI {tv:.2f} s (whole process) -> {tv/to:.2f}x ORT", flush=True)
if "scale" in cases:
    x = load(c2[0]); args = ["--roi", ",".join(map(str, x.shape)), "--overlap", "0", "--blend", "constant"]
    t1 = vx_time(*c2, args, threads=1); tn = vx_time(*c2, args, threads=ncpu)
    o1, _ = ort_time(c2[1], [x[None, None]], threads=1); on, _ = ort_time(c2[1], [x[None, None]], threads=ncpu)
    print(f"C2 scaling 1 -> {ncpu} cores: voxtile {t1:.2f} -> {tn:.2f} s ({t1/tn:.2f}x), "
          f"onnxruntime {o1:.2f} -> {on:.2f} s ({o1/on:.2f}x)", flush=True)
print(f"load average {os.getloadavg()[0]:.2f} at end", flush=True)
