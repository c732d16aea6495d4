#!/usr/bin/env python3
"""End-to-end check of the two converters against PyTorch + MONAI, with random weights:

    /tmp/tvenv/bin/python scripts/test_exports.py path/to/voxtile [--keep DIR] [--json OUT.json] [--device cuda]

1. an nnU-Net v2 results folder (PlainConvUNet, 2 folds, CTNormalization, 3 labels; transpose_forward
   [0,1,2] and a permuted one) -> scripts/nnunet_to_voxtile.py -> `voxtile segment` on a CT-like NIfTI,
   against the fold average in PyTorch through MONAI's sliding_window_inference (same windows, same
   preprocessing), and with --tta --placement nnunet against nnU-Net's own algorithm (per-window mirroring,
   nnU-Net's steps; scripts/nnunet_reference.py), whose gaussian and fp16 accumulation are then measured;
2. a MONAI bundle (UNet, ScaleIntensityRanged, SlidingWindowInferer) -> scripts/monai_bundle_to_voxtile.py
   -> `voxtile segment`, against the bundle's network through the bundle's inferer.
Needs torch, MONAI, dynamic_network_architectures, onnx, onnxruntime and nibabel. Exits 1 when an agreement
falls under its bar (printed with each figure; export_checks.BARS: exact on the CPU, fp16's on CUDA).
"""
import argparse
import json
import os
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import nnunet_reference as nref  # noqa: E402
from export_checks import BARS, agree, ct_volume, rel_l2, run, voxtile_logits  # noqa: E402

PY = sys.executable
LABELS = {"background": 0, "liver": 1, "tumour": 2}
FAILS = []


def bar(name, value, ok):
    """Print a figure and remember a failed bar."""
    print(f"  {name}: {value}{'' if ok else '   <-- FAIL'}")
    if not ok:
        FAILS.append(name)


def randomize(net, seed):
    """Random weights that keep activations O(1), norm affines away from identity."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if p.dim() == 1:
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (2.0 / p[0].numel()) ** 0.5)
    return net


def nnunet_plans(patch, spacing, transpose):
    arch = {
        "network_class_name": "dynamic_network_architectures.architectures.unet.PlainConvUNet",
        "arch_kwargs": {
            "n_stages": 4, "features_per_stage": [4, 8, 16, 16],
            "conv_op": "torch.nn.modules.conv.Conv3d",
            "kernel_sizes": [[1, 3, 3], [3, 3, 3], [3, 3, 3], [3, 3, 3]],
            "strides": [[1, 1, 1], [1, 2, 2], [2, 2, 2], [2, 2, 2]],
            "n_conv_per_stage": [2, 2, 2, 2], "n_conv_per_stage_decoder": [2, 2, 2], "conv_bias": True,
            "norm_op": "torch.nn.modules.instancenorm.InstanceNorm3d",
            "norm_op_kwargs": {"eps": 1e-05, "affine": True}, "dropout_op": None, "dropout_op_kwargs": None,
            "nonlin": "torch.nn.LeakyReLU", "nonlin_kwargs": {"inplace": True},
        },
        "_kw_requires_import": ["conv_op", "norm_op", "dropout_op", "nonlin"],
    }
    return {
        "dataset_name": "Dataset999_Toy", "plans_name": "nnUNetPlans",
        "original_median_spacing_after_transp": spacing, "original_median_shape_after_transp": [40, 50, 60],
        "image_reader_writer": "SimpleITKIO", "transpose_forward": transpose,
        "transpose_backward": [int(i) for i in np.argsort(transpose)],
        "configurations": {"3d_fullres": {
            "data_identifier": "nnUNetPlans_3d_fullres", "preprocessor_name": "DefaultPreprocessor",
            "batch_size": 2, "patch_size": patch, "median_image_size_in_voxels": [40, 50, 60], "spacing": spacing,
            "normalization_schemes": ["CTNormalization"], "use_mask_for_norm": [False],
            "resampling_fn_data": "resample_data_or_seg_to_shape",
            "resampling_fn_seg": "resample_data_or_seg_to_shape",
            "resampling_fn_data_kwargs": {"is_seg": False, "order": 3, "order_z": 0, "force_separate_z": None},
            "resampling_fn_seg_kwargs": {"is_seg": True, "order": 1, "order_z": 0, "force_separate_z": None},
            "resampling_fn_probabilities": "resample_data_or_seg_to_shape",
            "resampling_fn_probabilities_kwargs": {"is_seg": False, "order": 1, "order_z": 0,
                                                   "force_separate_z": None},
            "architecture": arch, "batch_dice": True}},
        "experiment_planner_used": "ExperimentPlanner", "label_manager": "LabelManager",
        "foreground_intensity_properties_per_channel": {"0": {
            "max": 1500.0, "mean": 95.0, "median": 90.0, "min": -1000.0,
            "percentile_00_5": -150.0, "percentile_99_5": 600.0, "std": 120.0}},
    }


def make_nnunet_folder(root, transpose):
    """Dataset999_Toy/nnUNetTrainer__nnUNetPlans__3d_fullres with fold_0 and fold_1 (random weights)."""
    from dynamic_network_architectures.architectures.unet import PlainConvUNet

    patch, spacing = [16, 24, 32], [2.0, 1.0, 1.5]  # network axes (after transpose_forward)
    plans = nnunet_plans(patch, spacing, transpose)
    ds = {"channel_names": {"0": "CT"}, "labels": LABELS, "numTraining": 10, "file_ending": ".nii.gz"}
    folder = os.path.join(root, "Dataset999_Toy", "nnUNetTrainer__nnUNetPlans__3d_fullres")
    kw = plans["configurations"]["3d_fullres"]["architecture"]["arch_kwargs"]
    for fold in (0, 1):
        os.makedirs(os.path.join(folder, f"fold_{fold}"))
        net = PlainConvUNet(
            input_channels=1, num_classes=len(LABELS), n_stages=4, features_per_stage=kw["features_per_stage"],
            conv_op=torch.nn.Conv3d, kernel_sizes=kw["kernel_sizes"], strides=kw["strides"],
            n_conv_per_stage=kw["n_conv_per_stage"], n_conv_per_stage_decoder=kw["n_conv_per_stage_decoder"],
            conv_bias=True, norm_op=torch.nn.InstanceNorm3d, norm_op_kwargs=kw["norm_op_kwargs"],
            nonlin=torch.nn.LeakyReLU, nonlin_kwargs={"inplace": True}, deep_supervision=True)
        randomize(net, 100 + fold)
        torch.save({"network_weights": net.state_dict(), "trainer_name": "nnUNetTrainer",
                    "inference_allowed_mirroring_axes": (0, 1, 2), "current_epoch": 1000,
                    "init_args": {"plans": plans, "configuration": "3d_fullres", "fold": fold, "dataset_json": ds}},
                   os.path.join(folder, f"fold_{fold}", "checkpoint_final.pth"))
    for name, obj in (("plans.json", plans), ("dataset.json", ds)):
        with open(os.path.join(folder, name), "w") as f:
            json.dump(obj, f, indent=1)
    return folder


def load_fold_mean(folder):
    """The fold average in PyTorch, built exactly as nnU-Net's predictor builds it (plans + checkpoints)."""
    import nnunet_to_voxtile as conv

    plans = json.load(open(os.path.join(folder, "plans.json")))
    cfg = conv.resolve_configuration(plans, "3d_fullres")
    nets = []
    for f in (0, 1):
        net, _ = conv.build_network(plans, "3d_fullres", cfg, "nnUNetTrainer", 1, len(LABELS))
        ck = torch.load(os.path.join(folder, f"fold_{f}", "checkpoint_final.pth"), weights_only=False)
        net.load_state_dict(ck["network_weights"])
        nets.append(conv.First(net).eval())
    return conv.FoldMean(nets).eval(), plans


def test_nnunet(voxtile, tmp, transpose, results, device="cpu"):
    print(f"nnU-Net, transpose_forward {transpose}:")
    folder = make_nnunet_folder(os.path.join(tmp, f"nn{''.join(map(str, transpose))}"), transpose)
    name = os.path.join(tmp, f"toy{''.join(map(str, transpose))}")
    print("  " + run([PY, os.path.join(HERE, "nnunet_to_voxtile.py"), os.path.dirname(folder), "-o", name,
                      "--configuration", "3d_fullres"]).strip().replace("\n", "\n  "))
    net, plans = load_fold_mean(folder)
    cfg = plans["configurations"]["3d_fullres"]
    props = plans["foreground_intensity_properties_per_channel"]["0"]
    # The file's (i,j,k) is SimpleITK's (x,y,z); nnU-Net's network axes are (z,y,x) transposed by transpose_forward.
    sp_zyx = [0.0] * 3
    for m, t in enumerate(transpose):
        sp_zyx[t] = cfg["spacing"][m]
    shape_ijk, spacing_ijk = (44, 38, 26), sp_zyx[::-1]
    vol = os.path.join(tmp, f"ct{''.join(map(str, transpose))}.nii.gz")
    raw = ct_volume(vol, shape_ijk, spacing_ijk)
    norm = (np.clip(raw, props["percentile_00_5"], props["percentile_99_5"]) - props["mean"]) / props["std"]
    net_in = np.ascontiguousarray(norm.transpose(2, 1, 0).transpose(transpose))  # nnU-Net's array, (D,H,W)
    back = lambda a: a.transpose([0] + [1 + int(i) for i in np.argsort(transpose)]).transpose(0, 3, 2, 1)
    patch = cfg["patch_size"]
    r = {}
    max_l2, min_pct = BARS[device]
    # A: one pass, MONAI placement and gaussian: voxtile against MONAI's sliding_window_inference.
    labels, logits = voxtile_logits(voxtile, vol, name + ".onnx", tmp, "nnA", ["--placement", "monai", "--tta", "off"],
                                    device=device)
    ref = back(nref.monai_logits(net, net_in, patch))
    r["monai_swi_rel_l2"], r["monai_swi_labels_pct"] = rel_l2(logits, ref), agree(labels, ref.argmax(0))
    bar("voxtile vs PyTorch+MONAI sliding window (no TTA): logits rel L2", f"{r['monai_swi_rel_l2']:.2e}",
        r["monai_swi_rel_l2"] <= max_l2)
    bar("  labels agree %", f"{r['monai_swi_labels_pct']:.4f}", r["monai_swi_labels_pct"] >= min_pct)
    # B: as nnUNetv2_predict runs (the manifest's placement nnunet and tta, no flags) against nnU-Net's algorithm.
    labels, logits = voxtile_logits(voxtile, vol, name + ".onnx", tmp, "nnB", [], device=device)
    mirror = [0, 1, 2]
    windows = nref.nnunet_windows(net, net_in, patch, mirror)
    same = back(nref.nnunet_blend(windows, patch, gaussian="nnunet"))
    r["nnunet_algo_rel_l2"], r["nnunet_algo_labels_pct"] = rel_l2(logits, same), agree(labels, same.argmax(0))
    bar("voxtile --tta --placement nnunet vs nnU-Net's steps + per-window mirroring + its gaussian: rel L2",
        f"{r['nnunet_algo_rel_l2']:.2e}", r["nnunet_algo_rel_l2"] <= max_l2)
    bar("  labels agree %", f"{r['nnunet_algo_labels_pct']:.4f}", r["nnunet_algo_labels_pct"] >= min_pct)
    # Measured, not required: what MONAI's gaussian (and nnU-Net 2.8's fp16 accumulators) change. With random
    # weights and a 16-voxel patch (sigma 2) overlapping windows disagree far more than a trained net's do.
    own = nref.nnunet_blend(windows, patch, gaussian="nnunet")
    half = nref.nnunet_blend(windows, patch, gaussian="nnunet", acc=torch.float16)
    monai_g = nref.nnunet_blend(windows, patch, gaussian="monai")
    for key, what, a_, b_ in (("vs_monai_gaussian", "voxtile vs the same blend with MONAI's gaussian", logits,
                               back(monai_g)),
                              ("vs_nnunet_fp16", "voxtile vs nnU-Net's gaussian + fp16 accumulators (nnU-Net 2.8)",
                               logits, back(half)),
                              ("fp16_alone", "nnU-Net's fp16 accumulators vs fp32 (same gaussian)", back(half),
                               back(own))):
        r[key + "_rel_l2"], r[key + "_labels_pct"] = rel_l2(a_, b_), agree(a_.argmax(0), b_.argmax(0))
        print(f"  measured: {what}: rel L2 {r[key + '_rel_l2']:.2e}, labels agree {r[key + '_labels_pct']:.4f} %")
    results[f"nnunet_transpose_{''.join(map(str, transpose))}"] = r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("voxtile", help="the voxtile binary")
    ap.add_argument("--keep", help="work in this folder and keep it (default: a temp folder)")
    ap.add_argument("--json", help="write the measured figures here")
    ap.add_argument("--only", default="nnunet,permuted,bundle")
    ap.add_argument("--device", default="cpu", choices=sorted(BARS), help="the backend voxtile segments on")
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, (os.cpu_count() or 2)))
    results = {"device": a.device, "bars": {"max_rel_l2": BARS[a.device][0], "min_labels_pct": BARS[a.device][1]}}
    with tempfile.TemporaryDirectory() as td:
        tmp = a.keep or td
        os.makedirs(tmp, exist_ok=True)
        only = a.only.split(",")
        if "nnunet" in only:
            test_nnunet(a.voxtile, tmp, [0, 1, 2], results, a.device)
        if "permuted" in only:
            test_nnunet(a.voxtile, tmp, [2, 0, 1], results, a.device)
        if "bundle" in only:
            import test_bundle

            test_bundle.test_bundle(a.voxtile, tmp, results, bar, a.device)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    if FAILS:
        print(f"FAILED: {', '.join(FAILS)}")
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
