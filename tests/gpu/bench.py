"""One device run: the PyTorch+MONAI peer and voxtile on the same nets (same random weights, exported
to ONNX here) and the same 512x512x128 volume; prints a table of times and ratios.

usage: python3 tests/gpu/bench.py VOXTILE_BENCH_BINARY OUTDIR [w1,w2,compiled]
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
json.dump(rows, open(f"{out}/bench.json", "w"), indent=1)
print("\nworkload  peer_eager_s  voxtile_s  ratio  labels_agree  peak_GiB(peer/voxtile)")
for r in rows:
    if "error" in r:
        print(r["workload"], "ERROR", r["error"]); continue
    print(f'{r["workload"]:8}  {r["peer_eager_s"]:12.4f}  {r["voxtile_s"]:9.4f}  {r["ratio_vs_eager"]:5.3f}  {r["label_agreement"]:12.5f}  {r["peer_peak_gib"]:.2f}/{r["voxtile_peak_device_gib"]:.2f}')
