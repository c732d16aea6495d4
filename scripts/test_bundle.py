"""The MONAI-bundle half of scripts/test_exports.py: a bundle folder written here (UNet with random weights,
Orientationd + ScaleIntensityRanged, SlidingWindowInferer, softmax then argmax), converted, segmented by
voxtile, and compared with the bundle's own network through the bundle's own inferer."""
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))

INFERENCE = {
    "imports": ["$import torch"],
    "bundle_root": ".",
    "device": "$torch.device('cpu')",
    "roi": [32, 32, 24],
    "network_def": {
        "_target_": "UNet", "spatial_dims": 3, "in_channels": 1, "out_channels": 3,
        "channels": [8, 16, 32, 32], "strides": [2, 2, 2], "num_res_units": 1, "norm": "batch",
    },
    "network": "$@network_def.to(@device)",
    "preprocessing": {"_target_": "Compose", "transforms": [
        {"_target_": "LoadImaged", "keys": "image"},
        {"_target_": "EnsureChannelFirstd", "keys": "image"},
        {"_target_": "Orientationd", "keys": "image", "axcodes": "RAS"},
        {"_target_": "ScaleIntensityRanged", "keys": "image", "a_min": -57, "a_max": 164, "b_min": 0.0,
         "b_max": 1.0, "clip": True},
        {"_target_": "EnsureTyped", "keys": "image"},
    ]},
    "inferer": {"_target_": "SlidingWindowInferer", "roi_size": "@roi", "sw_batch_size": 4, "overlap": 0.25,
                "mode": "gaussian"},
    "postprocessing": {"_target_": "Compose", "transforms": [
        {"_target_": "Activationsd", "keys": "pred", "softmax": True},
        {"_target_": "AsDiscreted", "keys": "pred", "argmax": True},
    ]},
}
METADATA = {
    "name": "toy_spleen_ct", "version": "0.1.0",
    "network_data_format": {
        "inputs": {"image": {"type": "image", "format": "hounsfield", "num_channels": 1,
                             "spatial_shape": [32, 32, 24]}},
        "outputs": {"pred": {"type": "image", "format": "segmentation", "num_channels": 3,
                             "channel_def": {"0": "background", "1": "spleen", "2": "kidney"}}},
    },
}


def make_bundle(root, seed=7):
    """configs/inference.json, configs/metadata.json, models/model.pt (random weights, eval-mode batch norm
    statistics moved off the identity so that a wrong fold shows)."""
    from monai.bundle import ConfigParser

    for d in ("configs", "models"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    for name, obj in (("inference.json", INFERENCE), ("metadata.json", METADATA)):
        with open(os.path.join(root, "configs", name), "w") as f:
            json.dump(obj, f, indent=1)
    p = ConfigParser()
    p.read_config(os.path.join(root, "configs", "inference.json"))
    net = p.get_parsed_content("network_def")
    g = torch.Generator().manual_seed(seed)
    sd = net.state_dict()
    for k, v in sd.items():
        if v.dtype.is_floating_point:
            if k.endswith("running_var"):
                sd[k] = 0.5 + torch.rand(v.shape, generator=g)
            elif v.dim() <= 1:
                sd[k] = (1.0 if k.endswith("weight") else 0.0) + 0.2 * torch.randn(v.shape, generator=g)
    net.load_state_dict(sd)
    torch.save(net.state_dict(), os.path.join(root, "models", "model.pt"))
    return net


def test_bundle(voxtile, tmp, results, bar, device="cpu"):
    from monai.bundle import ConfigParser

    from export_checks import BARS, agree, ct_volume, rel_l2, run, voxtile_logits

    print("MONAI bundle (UNet, ScaleIntensityRanged, SlidingWindowInferer overlap 0.25):")
    root = os.path.join(tmp, "toy_bundle")
    make_bundle(root)
    name = os.path.join(tmp, "bundle")
    print("  " + run([sys.executable, os.path.join(HERE, "monai_bundle_to_voxtile.py"), root, "-o", name,
                      "--force"]).strip().replace("\n", "\n  "))
    p = ConfigParser()
    p.read_config(os.path.join(root, "configs", "inference.json"))
    net = p.get_parsed_content("network_def")
    net.load_state_dict(torch.load(os.path.join(root, "models", "model.pt"), weights_only=True))
    net.eval()
    with open(name + ".toml") as f:
        orient = f.read().count('orientation = "RAS"')
    bar("converter: Orientationd(RAS) -> manifest orientation", orient, orient == 1)
    vol = os.path.join(tmp, "ct_bundle.nii.gz")
    ct_volume(vol, (58, 45, 31), (1.2, 1.2, 2.0), seed=3)  # RAS affine: Orientationd(RAS) is a no-op
    # The bundle's own preprocessing (LoadImaged ... ScaleIntensityRanged) and inferer on the same file.
    pre = p.get_parsed_content("preprocessing")
    x = pre({"image": vol})["image"]
    inferer = p.get_parsed_content("inferer")
    with torch.no_grad():
        ref = inferer(torch.as_tensor(np.asarray(x))[None].float(), net)[0].numpy()
    labels, logits = voxtile_logits(voxtile, vol, name + ".onnx", tmp, "bundle", device=device)
    max_l2, min_pct = BARS[device]
    r = {"rel_l2": rel_l2(logits, ref), "labels_pct": agree(labels, ref.argmax(0))}
    bar("voxtile vs the bundle's preprocessing + network + SlidingWindowInferer: logits rel L2",
        f"{r['rel_l2']:.2e}", r["rel_l2"] <= max_l2)
    bar("  labels agree %", f"{r['labels_pct']:.4f}", r["labels_pct"] >= min_pct)
    results["monai_bundle"] = r
