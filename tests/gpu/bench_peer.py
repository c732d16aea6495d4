"""The PyTorch side of tests/gpu/bench.py, one job per process so that a compile mode that fails,
hangs or crashes loses only itself (bench.py kills the process group at its timeout). The peer
setup is /work/shared/peers/peers_plus.py's (copied, since only the repository travels to the GPU
machine): the same nets, seeds and smooth random volume, MONAI sliding_window_inference with roi 128³
(the transformers W5 and W6: 96³), sw_batch 4, overlap 0.5, gaussian, under no_grad + torch.autocast fp16, the
volume on the GPU and the logits left there. Prints one JSON line last.

usage: python3 bench_peer.py prep WORK NETS            (CPU: vol.npy, NET.onnx and NET.pt per net)
       python3 bench_peer.py peer WORK NET MODE REPS [1024x1024x512]   (one peer mode on the GPU)
       python3 bench_peer.py k1                        (cuDNN fp16 conv 32->32 3³ on 2x32x128³)
"""
import json, sys, time
import numpy as np, torch, torch.nn as nn
import bench_table as bt  # this folder (the script's own) is on sys.path

ROI, SW_BATCH, OVERLAP = (128, 128, 128), 4, 0.5
# The transformers run at their usual roi; their ONNX fixes the window (SwinUNETR's window masks and
# UNETR's position embedding are traced for it).
ROIS = {"w5": (96, 96, 96), "w6": (96, 96, 96)}
# Warm passes of a compiled mode: at least 2 (reduce-overhead records its CUDA graphs on the
# second call), then until two passes agree within 5%, at most 4.
WARM_MIN, WARM_MAX, WARM_TOL = 2, 4, 0.05


def nnunet_ct():
    from dynamic_network_architectures.architectures.unet import PlainConvUNet
    return PlainConvUNet(1, 6, [32, 64, 128, 256, 320, 320], nn.Conv3d, 3, [1, 2, 2, 2, 2, 2], [2] * 6, 14, [2] * 5,
                         conv_bias=True, norm_op=nn.InstanceNorm3d, norm_op_kwargs={"eps": 1e-5, "affine": True},
                         nonlin=nn.LeakyReLU, nonlin_kwargs={"inplace": True})


def monai_unet():
    from monai.networks.nets import UNet
    return UNet(spatial_dims=3, in_channels=1, out_channels=14, channels=(16, 32, 64, 128, 256),
                strides=(2, 2, 2, 2), num_res_units=2, norm="instance")


def swinunetr():
    """MONAI's SwinUNETR as people train it (BTCV: feature_size 48, 14 classes), window 7."""
    from monai.networks.nets import SwinUNETR
    return SwinUNETR(in_channels=1, out_channels=14, feature_size=48, depths=(2, 2, 2, 2), num_heads=(3, 6, 12, 24))


def unetr():
    """MONAI's UNETR as people train it (BTCV: feature_size 16, hidden 768, mlp 3072, 12 heads, conv
    patch embedding), 14 classes, for a 96³ window. Its attention blocks need einops."""
    from monai.networks.nets import UNETR
    return UNETR(in_channels=1, out_channels=14, img_size=ROIS["w6"], feature_size=16, hidden_size=768, mlp_dim=3072,
                 num_heads=12, proj_type="conv")


# W4 runs W1's net on the large volume.
NETS = {"w1": nnunet_ct, "w2": monai_unet, "w4": nnunet_ct, "w5": swinunetr, "w6": unetr}
WEIGHTS = {"w1": "w1", "w2": "w2", "w4": "w1", "w5": "w5", "w6": "w6"}
# Workloads whose every peer mode keeps its labels (the agreement is with the best peer, known at the end).
LABELS_EVERY_MODE = {"w5", "w6"}


def build(name):
    """The net with seed 1 and randomised norm affines (so a wrong affine shows)."""
    torch.manual_seed(1)
    model = NETS[name]().eval()
    for m in model.modules():
        if isinstance(m, nn.InstanceNorm3d) and m.affine:
            nn.init.uniform_(m.weight, 0.5, 1.5); nn.init.uniform_(m.bias, -0.2, 0.2)
    return model


def prep(work, nets):
    """The peer's 512x512x128 volume and each net's weights (.pt for the workers, .onnx for voxtile)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    vol = torch.nn.functional.interpolate(torch.randn(1, 1, 64, 64, 16, generator=g), size=(512, 512, 128), mode="trilinear")
    vol = vol + 0.1 * torch.randn(1, 1, 512, 512, 128, generator=g)
    np.save(f"{work}/vol.npy", vol[0, 0].numpy().astype(np.float32))
    export_errors = {}
    for name in nets:
        if name in ROIS:
            # A transformer: its export fixes batch 1 and the window. A failure (UNETR's attention
            # without einops, say) costs that net only.
            try:
                model = build(name)
                torch.save(model.state_dict(), f"{work}/{name}.pt")
                torch.onnx.export(model, torch.randn(1, 1, *ROIS[name]), f"{work}/{name}.onnx", input_names=["image"],
                                  output_names=["logits"], opset_version=17, dynamo=False)
            except Exception as e:
                export_errors[name] = f"{type(e).__name__}: {e}"[:300]
            continue
        model = build(name)
        torch.save(model.state_dict(), f"{work}/{name}.pt")
        torch.onnx.export(model, torch.randn(1, 1, 64, 64, 64), f"{work}/{name}.onnx", input_names=["image"],
                          output_names=["logits"], opset_version=17, dynamo=False,
                          dynamic_axes={"image": {0: "N", 2: "D", 3: "H", 4: "W"}, "logits": {0: "N", 2: "D", 3: "H", 4: "W"}})
    return dict(volume=list(vol.shape[2:]), nets=nets, export_errors=export_errors)


def synthetic(shape, dev):
    """examples/bench.rs's volume for a DxHxW argument: (sin(0.05 d) + cos(0.07 h) sin(0.03 w)) 0.7."""
    d, h, w = (torch.arange(n, device=dev, dtype=torch.float32) for n in shape)
    v = torch.sin(d * 0.05)[:, None, None] + torch.cos(h * 0.07)[None, :, None] * torch.sin(w * 0.03)[None, None, :]
    return (v * 0.7)[None, None].contiguous()


def sliding(net, vol, roi=ROI):
    from monai.inferers import sliding_window_inference

    def f():
        with torch.no_grad(), torch.autocast("cuda", torch.float16):
            return sliding_window_inference(vol, roi, SW_BATCH, net, overlap=OVERLAP, mode="gaussian")
    return f


def one_pass(fn):
    torch.cuda.synchronize(); t = time.perf_counter(); y = fn(); torch.cuda.synchronize()
    return time.perf_counter() - t, y


def steady(fn, compiled, reps):
    """First pass (eager: cuDNN autotune; compiled: the compile too), warm passes, then the median of
    `reps` timed passes."""
    first, y = one_pass(fn); del y
    warm = []
    for _ in range(WARM_MAX if compiled else 0):
        t, y = one_pass(fn); del y
        warm.append(t)
        if len(warm) >= WARM_MIN and abs(warm[-1] - warm[-2]) <= WARM_TOL * warm[-2]:
            break
    times = []
    for _ in range(reps):
        t, y = one_pass(fn); del y
        times.append(t)
    return first, warm, sorted(times)[len(times) // 2], times


def peer(work, name, mode, reps, shape=None):
    """One peer mode of one workload: steady-state seconds, first pass, device peak; eager also
    writes its labels for the agreement check."""
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    model = build(name)
    model.load_state_dict(torch.load(f"{work}/{WEIGHTS[name]}.pt"))
    model = model.to(dev)
    vol = synthetic(shape, dev) if shape else torch.from_numpy(np.load(f"{work}/vol.npy"))[None, None].to(dev)
    if mode == "eager-cl":
        model = model.to(memory_format=torch.channels_last_3d)
        vol = vol.contiguous(memory_format=torch.channels_last_3d)
    net = model if mode in ("eager", "eager-cl") else torch.compile(model, mode=mode)
    fn = sliding(net, vol, ROIS.get(name, ROI))
    torch.cuda.reset_peak_memory_stats()
    compiled = mode not in ("eager", "eager-cl")
    first, warm, s, times = steady(fn, compiled, reps)
    out = dict(s=s, times=times, first_s=first, warm_s=warm, compiled=compiled,
               peak_gib=torch.cuda.max_memory_allocated() / 2**30)
    if compiled:  # the first pass less one steady pass
        out["compile_s"] = max(first - s, 0.0)
    if (mode == "eager" or name in LABELS_EVERY_MODE) and not shape:
        y = fn()
        labels = y.argmax(1)[0].to(torch.uint8).cpu().numpy()
        np.save(bt.peer_labels(work, name, mode), labels)
    return out


def k1():
    """cuDNN's fp16 conv 32->32 3³ on 2x32x128³, NCDHW and NDHWC, median of 20 after a warm-up."""
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    x = torch.randn(2, 32, 128, 128, 128, device=dev, dtype=torch.half)
    c = nn.Conv3d(32, 32, 3, padding=1).to(dev).half()
    out = {}
    for fmt in ("ncdhw", "ndhwc"):
        xx, cc = (x, c) if fmt == "ncdhw" else (x.to(memory_format=torch.channels_last_3d), c.to(memory_format=torch.channels_last_3d))

        def f():
            with torch.no_grad():
                return cc(xx)
        _, y = one_pass(f); del y
        ts = [one_pass(f)[0] for _ in range(20)]
        out[fmt] = sorted(ts)[10]
    return out


def facts():
    import monai
    return dict(gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else None, torch=torch.__version__,
                monai=monai.__version__, cudnn=torch.backends.cudnn.version())


def main(argv):
    job = argv[0]
    if job == "prep":
        out = prep(argv[1], argv[2].split(","))
    elif job == "peer":
        shape = [int(n) for n in argv[5].split("x")] if len(argv) > 5 else None
        out = peer(argv[1], argv[2], argv[3], int(argv[4]), shape)
    elif job == "k1":
        out = k1()
    else:
        raise SystemExit(f"bench_peer.py: unknown job {job!r} (prep, peer, k1)")
    print(json.dumps(dict(out, **facts())), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
