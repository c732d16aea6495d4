#!/usr/bin/env python3
"""An nnU-Net v2 trained-model folder -> NAME.onnx + NAME.toml (the voxtile manifest), in one command:

    python scripts/nnunet_to_voxtile.py RESULTS_FOLDER -o NAME [--folds 0,1] [--checkpoint checkpoint_final.pth]
            [--configuration 3d_fullres] [--ensemble merged|separate] [--dynamo] [--force]

RESULTS_FOLDER is the trainer folder (plans.json, dataset.json, fold_*/checkpoint_*.pth, e.g.
Dataset003_Liver/nnUNetTrainer__nnUNetPlans__3d_fullres) or the dataset folder above it (then
--configuration picks the trainer folder). The network is built from plans.json as nnU-Net builds it
(nnunetv2's trainer class when nnunetv2 is importable, else dynamic_network_architectures directly, which
is what nnU-Net's default trainers call), the checkpoint's `network_weights` are loaded, deep supervision
is off, and the fold average is one ONNX graph (mean of the folds' logits: what nnUNetPredictor computes).

What maps to the manifest, and what voxtile is told on the command line instead, is printed and written at
the top of NAME.toml. The manifest carries nnUNetv2_predict's defaults (placement nnunet, tta with the
checkpoint's mirror axes, sigma_scale 0.125, zero padding), so the result runs as nnU-Net does with:
    voxtile segment ct.nii.gz --model NAME.onnx -o seg.nii.gz
"""
import argparse
import copy
import glob
import json
import os
import pydoc
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from voxtile_export import (ExportError, First, check_onnx, export_onnx, fail, manifest_toml,  # noqa: E402
                            normalize_table, output_paths, warn, write_outputs)



class FoldMean(torch.nn.Module):
    """The folds' logits averaged in one graph: nnUNetPredictor sums the folds' sliding-window logits and
    divides by the fold count; blending is linear, so averaging per window is the same."""

    def __init__(self, nets):
        super().__init__()
        self.nets = torch.nn.ModuleList(nets)

    def forward(self, x):
        y = self.nets[0](x)
        for n in self.nets[1:]:
            y = y + n(x)
        return y * (1.0 / len(self.nets))


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ExportError(f"{path}: {e}")


def trainer_folder(root, configuration):
    """The folder holding plans.json: `root` itself, or its one `<trainer>__<plans>__<configuration>` child."""
    if os.path.isfile(os.path.join(root, "plans.json")):
        return root
    if not os.path.isdir(root):
        raise ExportError(f"{root}: not a folder")
    kids = sorted(d for d in os.listdir(root)
                  if os.path.isfile(os.path.join(root, d, "plans.json"))
                  and (configuration is None or d.split("__")[-1] == configuration))
    if len(kids) != 1:
        what = "no trainer folder with a plans.json" if not kids else f"several trainer folders ({', '.join(kids)})"
        hint = "" if configuration else " (pass --configuration, or the trainer folder itself)"
        raise ExportError(f"{root}: {what}{' for ' + configuration if configuration else ''}{hint}")
    return os.path.join(root, kids[0])


def resolve_configuration(plans, name, seen=()):
    """plans['configurations'][name] with `inherits_from` resolved (PlansManager.get_configuration)."""
    confs = plans.get("configurations", {})
    if name not in confs:
        raise ExportError(f"plans.json: no configuration '{name}' (it has {', '.join(confs)})")
    c = copy.deepcopy(confs[name])
    parent = c.pop("inherits_from", None)
    if parent is None:
        return c
    if parent in seen:
        raise ExportError(f"plans.json: configuration inheritance loops through {parent}")
    base = resolve_configuration(plans, parent, seen + (name,))
    base.update(c)
    return base


def architecture(cfg):
    """(class name, kwargs, kwargs to import) from a configuration; old plans (nnU-Net < 2.4) are converted
    as nnunetv2's ConfigurationManager converts them."""
    if "architecture" in cfg:
        a = cfg["architecture"]
        return a["network_class_name"], copy.deepcopy(a["arch_kwargs"]), list(a["_kw_requires_import"])
    old = cfg.get("UNet_class_name")
    mod = {"PlainConvUNet": "unet", "ResidualEncoderUNet": "residual_unet"}.get(old)
    if mod is None:
        raise ExportError(f"plans.json: old-format plans with UNet_class_name {old!r}: only PlainConvUNet and "
                          "ResidualEncoderUNet can be rebuilt (as nnU-Net does)")
    n = len(cfg["n_conv_per_stage_encoder"])
    dim = len(cfg["patch_size"])
    kw = {
        "n_stages": n,
        "features_per_stage": [min(cfg["UNet_base_num_features"] * 2 ** i, cfg["unet_max_num_features"])
                               for i in range(n)],
        "conv_op": f"torch.nn.modules.conv.Conv{dim}d",
        "kernel_sizes": copy.deepcopy(cfg["conv_kernel_sizes"]),
        "strides": copy.deepcopy(cfg["pool_op_kernel_sizes"]),
        ("n_conv_per_stage" if old == "PlainConvUNet" else "n_blocks_per_stage"): cfg["n_conv_per_stage_encoder"],
        "n_conv_per_stage_decoder": cfg["n_conv_per_stage_decoder"],
        "conv_bias": True,
        "norm_op": f"torch.nn.modules.instancenorm.InstanceNorm{dim}d",
        "norm_op_kwargs": {"eps": 1e-05, "affine": True},
        "dropout_op": None, "dropout_op_kwargs": None,
        "nonlin": "torch.nn.LeakyReLU", "nonlin_kwargs": {"inplace": True},
    }
    return f"dynamic_network_architectures.architectures.{mod}.{old}", kw, ["conv_op", "norm_op", "dropout_op",
                                                                              "nonlin"]


def locate_class(name):
    """pydoc.locate, then the class name anywhere under dynamic_network_architectures.architectures (the
    fallback of nnunetv2's get_network_from_plans: classes move between modules)."""
    cls = pydoc.locate(name)
    if cls is not None:
        return cls
    import importlib
    import pkgutil

    import dynamic_network_architectures.architectures as archs

    short = name.split(".")[-1]
    for m in pkgutil.walk_packages(archs.__path__, archs.__name__ + "."):
        try:
            mod = importlib.import_module(m.name)
        except Exception:
            continue
        if hasattr(mod, short):
            return getattr(mod, short)
    raise ExportError(f"plans.json: network class {name} not found (is dynamic_network_architectures installed?)")


def build_network(plans, conf_name, cfg, trainer_name, cin, cout):
    """The network of one configuration with deep supervision off, built by nnunetv2's trainer class when
    nnunetv2 is importable (custom trainers included), else as nnunetv2's get_network_from_plans does."""
    try:
        import inspect

        from nnunetv2.utilities.plans_handling.plans_handler import PlansManager
        try:
            from nnunetv2.utilities.find_objects import recursive_find_trainer_class_by_name
        except ImportError:
            from nnunetv2.utilities.find_class_by_name import recursive_find_trainer_class_by_name
    except ImportError:
        PlansManager = None
    if PlansManager is not None:
        p = copy.deepcopy(plans)
        p["configurations"][conf_name] = cfg
        pm = PlansManager(p)
        cm = pm.get_configuration(conf_name)
        tr = recursive_find_trainer_class_by_name(trainer_name)
        if tr is not None:
            if "plans_manager" in inspect.signature(tr.build_network_architecture).parameters:
                return tr.build_network_architecture(pm, cm, cin, cout, enable_deep_supervision=False), "nnunetv2"
            return tr.build_network_architecture(cm.network_arch_class_name, cm.network_arch_init_kwargs,
                                                 cm.network_arch_init_kwargs_req_import, cin, cout,
                                                 enable_deep_supervision=False), "nnunetv2"
        warn(f"trainer {trainer_name} not found in nnunetv2: building the network from plans.json")
    cls_name, kw, req = architecture(cfg)
    for k in req:
        if kw.get(k) is not None:
            kw[k] = pydoc.locate(kw[k])
            if kw[k] is None:
                raise ExportError(f"plans.json: cannot import {cfg['architecture']['arch_kwargs'][k]} ({k})")
    kw["deep_supervision"] = False
    return locate_class(cls_name)(input_channels=cin, num_classes=cout, **kw), "dynamic_network_architectures"


def permuted_configuration(cfg, inv):
    """The configuration whose network works on the input axes of nnU-Net's network permuted by `inv`:
    per-axis kernel sizes and strides reordered (an exact rewrite for conv/norm/nonlin nets)."""
    c = copy.deepcopy(cfg)
    if "architecture" in c:
        kw = c["architecture"]["arch_kwargs"]
        keys = ("kernel_sizes", "strides")
    else:
        kw, keys = c, ("conv_kernel_sizes", "pool_op_kernel_sizes")
    for k in keys:
        if k not in kw:
            raise ExportError(f"plans.json: the architecture has no {k}; cannot reorder its axes")
        kw[k] = [[s[i] for i in inv] if isinstance(s, (list, tuple)) else s for s in kw[k]]
    return c


def permute_weights(sd, inv):
    """Every 5-dim tensor (a 3D conv or transposed-conv kernel) with its spatial axes reordered by `inv`."""
    return {k: (v.permute(0, 1, *[2 + i for i in inv]).contiguous() if v.dim() == 5 else v) for k, v in sd.items()}


def clean_state_dict(sd):
    """Strip the `module.` (DDP) / `_orig_mod.` (torch.compile) prefixes some checkpoints carry."""
    for p in ("module.", "_orig_mod."):
        if sd and all(k.startswith(p) for k in sd):
            sd = {k[len(p):]: v for k, v in sd.items()}
    return sd


def classes_of(dataset):
    """Class names by output channel, or an error for region-based training."""
    labels = dataset.get("labels")
    if not isinstance(labels, dict) or "background" not in labels:
        raise ExportError("dataset.json: 'labels' must map names to values, background = 0")
    regions = {k: v for k, v in labels.items() if isinstance(v, (list, tuple)) and len(v) > 1}
    if regions:
        raise ExportError(
            f"dataset.json: region-based training ({', '.join(regions)} are label lists): nnU-Net turns its sigmoid "
            "outputs into labels by thresholding each region at 0.5 in regions_class_order, which voxtile's "
            "argmax cannot reproduce; export not done")
    by_value = {}
    for k, v in labels.items():
        if k == "ignore":
            continue
        v = int(v[0] if isinstance(v, (list, tuple)) else v)
        by_value[v] = k
    if sorted(by_value) != list(range(len(by_value))):
        raise ExportError(f"dataset.json: labels must be 0..n-1 (nnU-Net's rule), got {sorted(by_value)}")
    return [by_value[i] for i in range(len(by_value))]


def normalization(plans, cfg, cin):
    """The manifest's [normalize] table for the configuration's per-channel schemes, plus notes."""
    schemes = cfg.get("normalization_schemes", [])
    masks = cfg.get("use_mask_for_norm", [False] * cin)
    props = plans.get("foreground_intensity_properties_per_channel", {})
    notes, tables = [], []
    for c in range(cin):
        s = schemes[c] if c < len(schemes) else None
        if s == "CTNormalization":
            p = props.get(str(c))
            if p is None:
                raise ExportError(f"plans.json: CTNormalization of channel {c} but no "
                                  "foreground_intensity_properties_per_channel")
            t = normalize_table("ct", clip=[p["percentile_00_5"], p["percentile_99_5"]], mean=p["mean"], std=p["std"])
        elif s == "ZScoreNormalization":
            t = {"kind": "zscore"}
            if c < len(masks) and masks[c]:
                notes.append(f"channel {c}: nnU-Net z-scores inside the nonzero mask and sets the outside to 0 "
                             "(use_mask_for_norm); the manifest has no such mode: voxtile z-scores the whole volume")
        elif s == "RescaleTo01Normalization":
            t = {"kind": "percentile", "p_lo": 0.0, "p_hi": 100.0}  # (x - min) / (max - min)
        elif s == "RGBTo0_1Normalization":
            t = normalize_table("ct", clip=[0.0, 255.0], mean=0.0, std=255.0)  # x / 255 on 0..255 inputs
        elif s == "NoNormalization":
            t = {"kind": "none"}
        else:
            raise ExportError(f"plans.json: normalisation scheme {s!r} of channel {c} has no manifest equivalent")
        tables.append(t)
    if any(t != tables[0] for t in tables):
        raise ExportError(f"plans.json: channels normalised differently ({', '.join(map(str, schemes))}); the "
                          "manifest has one [normalize] for every channel")
    return tables[0], notes


def find_folds(folder, folds, checkpoint):
    if folds is None:
        found = sorted(glob.glob(os.path.join(folder, "fold_*", checkpoint)))
        folds = [os.path.basename(os.path.dirname(p))[5:] for p in found]
        if not folds:
            raise ExportError(f"{folder}: no fold_*/{checkpoint}")
    paths = [os.path.join(folder, f"fold_{f}", checkpoint) for f in folds]
    for p in paths:
        if not os.path.isfile(p):
            raise ExportError(f"{p}: missing")
    return folds, paths


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("results", help="nnU-Net trainer folder (or the dataset folder above it)")
    ap.add_argument("-o", "--output", required=True, help="NAME: writes NAME.onnx and NAME.toml")
    ap.add_argument("--folds", help="comma-separated, e.g. 0,1,2,3,4 or all (default: every fold_* found)")
    ap.add_argument("--checkpoint", default="checkpoint_final.pth")
    ap.add_argument("--configuration", help="default: the checkpoint's (init_args.configuration)")
    ap.add_argument("--ensemble", choices=["merged", "separate"], default="merged",
                    help="merged: one ONNX averaging the folds' logits (default); separate: NAME_fold_K.onnx each")
    ap.add_argument("--dynamo", action="store_true", help="torch.onnx's dynamo exporter (default: legacy, opset 17)")
    ap.add_argument("--no-check", action="store_true", help="skip the onnxruntime check of the export")
    ap.add_argument("--force", action="store_true", help="overwrite NAME.onnx / NAME.toml")
    a = ap.parse_args(argv)
    try:
        run(a)
    except ExportError as e:
        fail(str(e))


def load_checkpoints(paths):
    cks = []
    for p in paths:
        try:
            # nnU-Net checkpoints hold numpy values besides the weights: weights_only=False, as nnU-Net loads them.
            ck = torch.load(p, map_location="cpu", weights_only=False)
        except Exception as e:
            raise ExportError(f"{p}: not a readable checkpoint ({type(e).__name__}: {e})")
        if not isinstance(ck, dict) or "network_weights" not in ck:
            raise ExportError(f"{p}: no network_weights (not an nnU-Net v2 checkpoint)")
        cks.append(ck)
    return cks


def run(a):
    folder = trainer_folder(a.results, a.configuration)
    plans = load_json(os.path.join(folder, "plans.json"))
    dataset = load_json(os.path.join(folder, "dataset.json"))
    folds = None if a.folds is None else [f.strip() for f in a.folds.split(",")]
    folds, ck_paths = find_folds(folder, folds, a.checkpoint)
    extra = [f"_fold_{f}.onnx" for f in folds] if a.ensemble == "separate" else []
    base, _ = output_paths(a.output, a.force, [folder, *ck_paths], extra)
    cks = load_checkpoints(ck_paths)
    init = cks[0].get("init_args", {})
    conf_name = a.configuration or init.get("configuration") or os.path.basename(folder.rstrip("/")).split("__")[-1]
    trainer = cks[0].get("trainer_name") or os.path.basename(folder.rstrip("/")).split("__")[0]
    cfg = resolve_configuration(plans, conf_name)
    if len(cfg["patch_size"]) != 3:
        raise ExportError(f"plans.json: configuration {conf_name} is {len(cfg['patch_size'])}D; voxtile runs 3D nets")
    if cfg.get("previous_stage"):
        raise ExportError(f"plans.json: {conf_name} is a cascade stage (needs {cfg['previous_stage']}'s labels "
                          "as input channels); export the low-resolution stage or 3d_fullres instead")
    classes = classes_of(dataset)
    cin = len(dataset.get("channel_names") or dataset.get("modality") or {})
    if cin == 0:
        raise ExportError("dataset.json: no channel_names")
    norm, notes = normalization(plans, cfg, cin)

    # nnU-Net's network axes are transpose_forward of SimpleITK's (k, j, i). voxtile's "zyx" is (k, j, i):
    # any other transpose is folded into the kernels (conv nets are equivariant to axis permutations).
    tf = list(plans.get("transpose_forward", [0, 1, 2]))
    inv = [int(i) for i in np.argsort(tf)]
    permuted = tf != [0, 1, 2]
    run_cfg = permuted_configuration(cfg, inv) if permuted else cfg
    mirror = cks[0].get("inference_allowed_mirroring_axes", init.get("inference_allowed_mirroring_axes"))
    mirror = [0, 1, 2] if mirror is None else [int(tf[m]) for m in mirror]
    roi = [int(cfg["patch_size"][i]) for i in inv]
    spacing = [float(cfg["spacing"][i]) for i in inv]

    nets, built_by = [], None
    for p, ck in zip(ck_paths, cks):
        net, built_by = build_network(plans, conf_name, run_cfg, trainer, cin, len(classes))
        sd = clean_state_dict(ck["network_weights"])
        try:
            net.load_state_dict(permute_weights(sd, inv) if permuted else sd)
        except RuntimeError as e:
            raise ExportError(f"{p}: weights do not fit the plans' network: {str(e).splitlines()[0]}")
        nets.append(First(net).eval())
    if permuted:
        check_permutation(plans, conf_name, cfg, trainer, cin, len(classes), clean_state_dict(cks[0]["network_weights"]),
                          nets[0], tf, roi)

    name = f"{plans.get('dataset_name', os.path.basename(os.path.dirname(folder.rstrip('/'))))} {conf_name}"
    fields = {
        "name": f"{name} folds {','.join(folds)}",
        "classes": classes,
        "axis_order": "zyx",
        "spacing": spacing,
        "roi": roi,
        "overlap": 0.5,
        "blend": "gaussian",
        "activation": "none",
        "mirror_axes": mirror,
        # nnUNetv2_predict's defaults: even window steps, mirroring on, gaussian sigma 1/8 of the
        # patch, the image padded with zeros (pad_nd_image 'constant', value 0).
        "placement": "nnunet",
        "tta": bool(mirror),
        "sigma_scale": 0.125,
        "pad": 0.0,
        "normalize": norm,
        # nnU-Net never reorients: it runs on the array as each dataset's files store it (SimpleITK, zyx).
        "orientation": "stored",
    }
    cmd_models = (f"--model {os.path.basename(base)}.onnx" if a.ensemble == "merged" else
                  " ".join(f"--model {os.path.basename(base)}_fold_{f}.onnx" for f in folds)
                  + f" --manifest {os.path.basename(base)}.toml")
    lacks = [
        "activation none: TTA, folds and resampling average logits, as nnU-Net does; --probabilities then "
        "holds averaged logits (use --activation softmax for probabilities: labels may then differ from "
        "nnU-Net's at a few boundary voxels)",
        "nnU-Net resamples the image with 3rd-order splines and the logits linearly; voxtile resamples both "
        "trilinearly (only where the input spacing differs from `spacing`)",
        "nnU-Net crops to the nonzero bounding box first and labels the outside 0; voxtile runs the whole volume",
    ]
    if permuted:
        lacks.insert(0, f"transpose_forward {tf}: folded into the kernels (network axes = file k,j,i), "
                        "checked against the original network")
    comments = [f"voxtile manifest written by scripts/nnunet_to_voxtile.py from {os.path.abspath(folder)}",
                f"checkpoint {a.checkpoint}, folds {','.join(folds)}, trainer {trainer}, network built by {built_by}",
                f"run: voxtile segment IN.nii.gz {cmd_models} -o OUT.nii.gz (placement nnunet and tta are in the manifest)",
                *lacks, *notes]
    files = []
    if a.ensemble == "merged":
        model = FoldMean(nets).eval() if len(nets) > 1 else nets[0]
        files.append((base + ".onnx", export_one(model, cin, roi, base + ".onnx", a)))
    else:
        for f, net in zip(folds, nets):
            files.append((f"{base}_fold_{f}.onnx", export_one(net, cin, roi, f"{base}_fold_{f}.onnx", a)))
    files.append((base + ".toml", manifest_toml(fields, comments)))
    write_outputs(files)
    for line in comments[2:]:
        print(line)
    print(f"wrote {', '.join(f for f, _ in files)}")


def export_one(model, cin, roi, path, a):
    tmp = export_onnx(model, cin, roi, path, dynamo=a.dynamo)
    if not a.no_check:
        rel = check_onnx(model, tmp, cin, roi)
        print(f"{os.path.basename(path)}: onnxruntime vs PyTorch on one {'x'.join(map(str, roi))} window: "
              f"rel L2 {rel:.2e}")
        if not rel < 1e-4:
            os.remove(tmp)
            raise ExportError(f"{path}: onnxruntime disagrees with PyTorch (rel L2 {rel:.2e}); not written")
    return tmp


def check_permutation(plans, conf_name, cfg, trainer, cin, cout, sd, permuted_net, tf, roi):
    """The reordered network on x equals nnU-Net's network on x transposed by transpose_forward, transposed
    back: refuses the export otherwise (a layer that is not a per-axis conv/norm/nonlin)."""
    orig, _ = build_network(plans, conf_name, cfg, trainer, cin, cout)
    orig.load_state_dict(sd)
    orig = First(orig).eval()
    x = torch.randn(1, cin, *roi, generator=torch.Generator().manual_seed(1))
    back = [0, 1] + [2 + int(i) for i in np.argsort(tf)]
    with torch.no_grad():
        want = orig(x.permute(0, 1, *[2 + t for t in tf])).permute(*back)
        got = permuted_net(x)
    rel = float((got - want).norm() / want.norm().clamp_min(1e-30))
    if not rel < 1e-4:
        raise ExportError(f"plans.json: transpose_forward {tf} could not be folded into the network "
                          f"(rel L2 {rel:.1e}); not written")


if __name__ == "__main__":
    main()
