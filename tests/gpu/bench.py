"""One device run: the PyTorch+MONAI peer and voxtile on the same nets (same random weights, exported
to ONNX here) and the same 512x512x128 volume; prints a table of times and ratios.

usage: python3 tests/gpu/bench.py VOXTILE_BENCH_BINARY OUTDIR [w1,w2,compiled,k1,w3,mem,w1x2]
"""
import json, os, subprocess, sys, time
import numpy as np, torch, torch.nn as nn
from monai.inferers import sliding_window_inference
from monai.networks.nets import UNet
from dynamic_network_architectures.architectures.unet import PlainConvUNet

bench_bin, out = sys.argv[1], sys.argv[2]
which = (sys.argv[3] if len(sys.argv) > 3 else "w1,w2").split(",")
os.makedirs(out, exist_ok=True)
torch.backends.cudnn.benchmark = True
dev = torch.device("cuda")


def nnunet_ct():
    return PlainConvUNet(1, 6, [32, 64, 128, 256, 320, 320], nn.Conv3d, 3, [1, 2, 2, 2, 2, 2], [2] * 6, 14, [2] * 5,
                         conv_bias=True, norm_op=nn.InstanceNorm3d, norm_op_kwargs={"eps": 1e-5, "affine": True},
                         nonlin=nn.LeakyReLU, nonlin_kwargs={"inplace": True})


def monai_unet():
    return UNet(spatial_dims=3, in_channels=1, out_channels=14, channels=(16, 32, 64, 128, 256),
                strides=(2, 2, 2, 2), num_res_units=2, norm="instance")


def timed(fn, reps=3):
    fn(); torch.cuda.synchronize(); ts = []
    for _ in range(reps):
        torch.cuda.synchronize(); t = time.perf_counter(); y = fn(); torch.cuda.synchronize(); ts.append(time.perf_counter() - t)
    return sorted(ts)[reps // 2], y


g = torch.Generator(device="cpu").manual_seed(0)
vol = torch.nn.functional.interpolate(torch.randn(1, 1, 64, 64, 16, generator=g), size=(512, 512, 128), mode="trilinear")
vol = vol + 0.1 * torch.randn(1, 1, 512, 512, 128, generator=g)
np.save(f"{out}/vol.npy", vol[0, 0].numpy().astype(np.float32))
vol = vol.to(dev)
rows = []
for name, mk in [("w1", nnunet_ct), ("w2", monai_unet)]:
    if name not in which:
        continue
    torch.manual_seed(1)
    model = mk().eval()
    # Randomised norm affines so a wrong affine shows.
    for m in model.modules():
        if isinstance(m, nn.InstanceNorm3d) and m.affine:
            nn.init.uniform_(m.weight, 0.5, 1.5); nn.init.uniform_(m.bias, -0.2, 0.2)
    onnx_path = f"{out}/{name}.onnx"
    torch.onnx.export(model, torch.randn(1, 1, 64, 64, 64), onnx_path, input_names=["image"], output_names=["logits"],
                      dynamic_axes={"image": {0: "N", 2: "D", 3: "H", 4: "W"}, "logits": {0: "N", 2: "D", 3: "H", 4: "W"}},
                      opset_version=17, dynamo=False)
    model = model.to(dev)

    def peer():
        with torch.no_grad(), torch.autocast("cuda", torch.float16):
            return sliding_window_inference(vol, (128, 128, 128), 4, model, overlap=0.5, mode="gaussian")
    torch.cuda.reset_peak_memory_stats()
    t_peer, y = timed(peer)
    peak_peer = torch.cuda.max_memory_allocated() / 2**30
    peer_labels = y.argmax(1)[0].cpu().numpy()
    del y
    t_comp = None
    if "compiled" in which and name == "w1":
        mc = torch.compile(model)
        def peer_c():
            with torch.no_grad(), torch.autocast("cuda", torch.float16):
                return sliding_window_inference(vol, (128, 128, 128), 4, mc, overlap=0.5, mode="gaussian")
        t_comp, _ = timed(peer_c)
    torch.cuda.empty_cache()
    env = dict(os.environ)
    r = subprocess.run([bench_bin, onnx_path, f"{out}/vol.npy", "128", "0.5", "4", "3", "cuda", f"{out}/{name}_labels.npy"],
                       capture_output=True, text=True, env=env)
    sys.stderr.write(r.stderr[-3000:])
    if r.returncode != 0:
        rows.append(dict(workload=name, peer_s=t_peer, error=r.stderr.strip().splitlines()[-1:] )); continue
    vx = json.loads(r.stdout.strip().splitlines()[-1])
    lab = np.load(f"{out}/{name}_labels.npy")
    agree = float((lab.astype(np.int64) == peer_labels).mean())
    row = dict(workload=name, peer_eager_s=round(t_peer, 4), peer_peak_gib=round(peak_peer, 2),
               peer_compiled_s=None if t_comp is None else round(t_comp, 4),
               voxtile_s=round(vx["median_s"], 4), voxtile_first_s=round(vx["first_s"], 3),
               ratio_vs_eager=round(vx["median_s"] / t_peer, 3),
               ratio_vs_compiled=None if t_comp is None else round(vx["median_s"] / t_comp, 3),
               voxtile_peak_device_gib=(vx["report"].get("peak_device_bytes") or 0) / 2**30,
               label_agreement=round(agree, 5), windows=vx["report"]["windows"], gpu=vx["report"].get("gpu"))
    rows.append(row)
    print(json.dumps(row), flush=True)
    del model; torch.cuda.empty_cache()
# K1: one fp16 conv 32->32 3^3 on 2x32x128^3, cuDNN (NDHWC and NCDHW) vs voxtile's kernel (its timing
# test in cuda_ops, same process-free GPU, same run).
if "k1" in which:
    x = torch.randn(2, 32, 128, 128, 128, device=dev, dtype=torch.half)
    c = nn.Conv3d(32, 32, 3, padding=1).to(dev).half()
    fl = 2 * 2 * 32 * 128**3 * 32 * 27
    k1 = {}
    for fmt in ("ncdhw", "ndhwc"):
        xx, cc = (x, c) if fmt == "ncdhw" else (x.to(memory_format=torch.channels_last_3d), c.to(memory_format=torch.channels_last_3d))
        def f():
            with torch.no_grad():
                return cc(xx)
        t, _ = timed(f, 20)
        k1[fmt] = t
    ops = os.path.join(os.path.dirname(bench_bin), "cuda_ops")
    r = subprocess.run([ops, "bench_conv_32_32", "--nocapture", "--test-threads=1"], capture_output=True, text=True)
    vx = None
    for line in r.stdout.splitlines():
        if line.startswith("RESULT bench conv 32->32"):
            vx = float(line.split(":")[1].split("ms")[0]) / 1e3
    row = dict(workload="k1", cudnn_ndhwc_s=k1["ndhwc"], cudnn_ncdhw_s=k1["ncdhw"], voxtile_s=vx,
               cudnn_ndhwc_tflops=round(fl / k1["ndhwc"] / 1e12, 1),
               voxtile_tflops=None if vx is None else round(fl / vx / 1e12, 1),
               speedup_vs_cudnn_ndhwc=None if vx is None else round(k1["ndhwc"] / vx, 3))
    rows.append(row); print(json.dumps(row), flush=True)

# W3: the whole CLI process, int16 512x512x128 .nii.gz -> uint8 labels .nii.gz, W1's net, against
# peer_e2e.py (nibabel + MONAI + PyTorch) timed the same way. voxtile twice: cold NVRTC cache, then warm.
if "w3" in which and os.path.exists(f"{out}/w1.onnx"):
    wheels = os.path.join(os.path.dirname(bench_bin), "wheels")
    ct20 = os.path.join(os.path.dirname(bench_bin), "shared", "fixtures", "volumes", "ts_ct_512x512x20.nii.gz")
    ct = f"{out}/ct512.nii.gz"
    subprocess.run([sys.executable, f"{wheels}/make_ct512.py", ct20, ct], check=True)
    def wall(cmd, env=None):
        t = time.perf_counter(); r = subprocess.run(cmd, capture_output=True, text=True, env=env); w = time.perf_counter() - t
        if r.returncode != 0:
            sys.stderr.write(r.stderr[-2000:])
        return w, r
    t_peer, r = wall([sys.executable, f"{wheels}/peer_e2e.py", ct, f"{out}/peer_seg.nii.gz"])
    print("peer:", r.stdout.strip(), flush=True)
    vx_bin = os.path.join(os.path.dirname(bench_bin), "voxtile")
    cache = f"{out}/vx-cache"
    env = dict(os.environ, XDG_CACHE_HOME=cache)
    cmd = [vx_bin, "segment", ct, "--model", f"{out}/w1.onnx", "-o", f"{out}/vx_seg.nii.gz", "--roi", "128",
           "--overlap", "0.5", "--batch", "4", "--normalize", "zscore", "--device", "cuda", "--force",
           "--report", f"{out}/w3_report.json"]
    t_cold, r1 = wall(cmd, env)
    t_warm, r2 = wall(cmd, env)
    rep = json.load(open(f"{out}/w3_report.json")) if r2.returncode == 0 else {}
    row = dict(workload="w3", peer_wall_s=round(t_peer, 3), voxtile_cold_wall_s=round(t_cold, 3),
               voxtile_warm_wall_s=round(t_warm, 3), speedup_warm=round(t_peer / t_warm, 2),
               speedup_cold=round(t_peer / t_cold, 2), stages=rep.get("seconds"), rc=[r1.returncode, r2.returncode])
    rows.append(row); print(json.dumps(row), flush=True)

# W1x2 (issue 7): W1's net and volume on cuda:0, then split across cuda:0,1 (one volume's windows
# by D planes), same bench binary, same run: both medians, the speed-up, labels identical?
# (W1 has instance norm, whose atomic sums can flip a rare voxel even between two cuda:0 runs.)
if "w1x2" in which:
    if torch.cuda.device_count() < 2 or not os.path.exists(f"{out}/w1.onnx"):
        print(f"w1x2 skipped: {torch.cuda.device_count()} GPU(s), w1.onnx there: {os.path.exists(f'{out}/w1.onnx')} (needs w1 in the same run)", flush=True)
    else:
        runs = {}
        for devs in ("cuda:0", "cuda:0,1"):
            lab = f"{out}/w1x2_{devs.replace(':', '').replace(',', '_')}.npy"
            r = subprocess.run([bench_bin, f"{out}/w1.onnx", f"{out}/vol.npy", "128", "0.5", "4", "3", devs, lab],
                               capture_output=True, text=True)
            sys.stderr.write(r.stderr[-2000:])
            runs[devs] = (json.loads(r.stdout.strip().splitlines()[-1]), np.load(lab)) if r.returncode == 0 else (
                dict(error=r.stderr.strip().splitlines()[-1:]), None)
        (j1, l1), (j2, l2) = runs["cuda:0"], runs["cuda:0,1"]
        if l1 is None or l2 is None:
            row = dict(workload="w1x2", error=[j1.get("error"), j2.get("error")])
        else:
            rep = j2["report"]
            row = dict(workload="w1x2", one_gpu_s=round(j1["median_s"], 4), two_gpu_s=round(j2["median_s"], 4),
                       speedup=round(j1["median_s"] / j2["median_s"], 3),
                       labels_identical=bool(np.array_equal(l1, l2)),
                       label_agreement=float((l1 == l2).mean()),
                       windows=rep["windows"], windows_run=rep.get("windows_run"),
                       parts=[dict(planes=p["planes"], windows=p["windows"], compute_s=round(p["compute_seconds"], 3),
                                   peak_device_gib=round((p.get("peak_device_bytes") or 0) / 2**30, 2))
                              for p in rep.get("parts", [])],
                       one_gpu_peak_device_gib=round((j1["report"].get("peak_device_bytes") or 0) / 2**30, 2))
        rows.append(row); print(json.dumps(row), flush=True)

# Memory budget (issue 4): W1 at 2/4/8 GiB on 512x512x128 (planner's prediction vs the measured
# device peak), and volume size vs peak vs time at 4 GiB up to 1024x1024x512.
if "mem" in which and os.path.exists(f"{out}/w1.onnx"):
    def vx_run(vol, budget, reps="1"):
        try:
            r = subprocess.run([bench_bin, f"{out}/w1.onnx", vol, "auto", "0.5", "auto", reps, "cuda", "-", budget],
                               capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            return dict(error="timed out after 60 s")
        if r.returncode != 0:
            return dict(error=r.stderr.strip().splitlines()[-1:] if r.stderr.strip() else r.returncode)
        j = json.loads(r.stdout.strip().splitlines()[-1]); rep = j["report"]
        pred = (rep.get("predicted_peak_bytes") or {}).get("device") or 0
        meas = rep.get("peak_device_bytes") or 0
        gpu = rep.get("gpu") or {}
        return dict(budget=budget, volume=vol if not vol.endswith(".npy") else "512x512x128", roi=rep["roi"],
                    batch=rep["batch"], windows=rep["windows"], seconds=round(j["median_s"], 3),
                    predicted_device_gib=round(pred / 2**30, 3), measured_device_gib=round(meas / 2**30, 3),
                    pred_over_meas=round(pred / meas, 3) if meas else None,
                    cuMemGetInfo_used_gib=round((gpu.get("mem_info_used_during", 0) - gpu.get("mem_info_used_before", 0)) / 2**30, 3),
                    oom_retries=rep.get("oom_retries"))
    for b in ("2GiB", "4GiB", "8GiB"):
        row = dict(workload="mem", **vx_run(f"{out}/vol.npy", b)); rows.append(row); print(json.dumps(row), flush=True)
    for v in ("1024x1024x256", "1024x1024x512"):
        row = dict(workload="mem", **vx_run(v, "4GiB", "0")); rows.append(row); print(json.dumps(row), flush=True)

json.dump(rows, open(f"{out}/bench.json", "w"), indent=1)
print("\nworkload  peer_eager_s  voxtile_s  ratio  labels_agree  peak_GiB(peer/voxtile)")
for r in rows:
    if r.get("workload") == "mem":
        print("mem      ", {k: r.get(k) for k in ("budget", "volume", "roi", "batch", "windows", "seconds", "predicted_device_gib", "measured_device_gib", "pred_over_meas", "error")})
        continue
    if r.get("workload") == "k1":
        print(f'k1        cuDNN NDHWC {r["cudnn_ndhwc_s"]*1e3:.3f} ms ({r["cudnn_ndhwc_tflops"]} TF/s), voxtile {r["voxtile_tflops"]} TF/s: speed-up {r["speedup_vs_cudnn_ndhwc"]}')
        continue
    if r.get("workload") == "w1x2":
        if "error" in r:
            print("w1x2 ERROR", r["error"]); continue
        print(f'w1x2      cuda:0 {r["one_gpu_s"]} s, cuda:0,1 {r["two_gpu_s"]} s: speed-up {r["speedup"]}x; labels identical {r["labels_identical"]} (agreement {r["label_agreement"]:.6f}); windows {r["windows"]} -> {r["windows_run"]} run')
        continue
    if r.get("workload") == "w3":
        print(f'w3        peer wall {r["peer_wall_s"]} s, voxtile wall {r["voxtile_warm_wall_s"]} s (cold cache {r["voxtile_cold_wall_s"]} s): {r["speedup_warm"]}x faster')
        continue
    if "error" in r:
        print(r["workload"], "ERROR", r["error"]); continue
    print(f'{r["workload"]:8}  {r["peer_eager_s"]:12.4f}  {r["voxtile_s"]:9.4f}  {r["ratio_vs_eager"]:5.3f}  {r["label_agreement"]:12.5f}  {r["peer_peak_gib"]:.2f}/{r["voxtile_peak_device_gib"]:.2f}')
