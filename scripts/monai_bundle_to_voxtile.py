#!/usr/bin/env python3
"""A MONAI bundle -> NAME.onnx + NAME.toml (the voxtile manifest):

    python scripts/monai_bundle_to_voxtile.py BUNDLE_DIR -o NAME [--config configs/inference.json]
            [--weights models/model.pt] [--dynamo] [--force]

The network is the bundle's `network_def` instantiated by monai.bundle.ConfigParser, with the state dict of
models/model.pt. The window settings come from the `inferer` (SlidingWindowInferer: roi_size, overlap, mode,
sigma_scale, padding_mode/cval as `pad`, placement monai, tta false; sw_batch_size only batches, voxtile picks its
own), the class names from metadata.json's channel_def, and
the intensity transforms of `preprocessing` that the manifest can express:
  ScaleIntensityRanged           -> normalize ct (clip to [a_min, a_max], then the same linear map)
  NormalizeIntensityd            -> normalize zscore (or ct with its subtrahend / divisor)
  ScaleIntensityRangePercentilesd-> normalize percentile (b_min 0, b_max 1, clip, not relative)
  ScaleIntensityd (0..1)         -> normalize percentile 0..100 (min-max)
  Spacingd                       -> spacing
  Orientationd                   -> orientation (voxtile turns inputs to those axis codes and the outputs back)
Every other transform that changes values or geometry is listed in a warning.
"""
import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from voxtile_export import (ExportError, First, check_onnx, export_onnx, fail, manifest_toml,  # noqa: E402
                            normalize_table, output_paths, warn, write_outputs)

F32_MAX = float(np.finfo(np.float32).max)
# Transforms that change neither values nor geometry (loading, channel layout, types).
NEUTRAL = {"LoadImaged", "LoadImage", "EnsureChannelFirstd", "EnsureChannelFirst", "AddChanneld", "AddChannel",
           "EnsureTyped", "EnsureType", "ToTensord", "ToTensor", "CastToTyped", "CastToType", "ToDeviced",
           "ToNumpyd", "Identityd", "DeleteItemsd", "SelectItemsd"}



def parser_for(bundle, config):
    from monai.bundle import ConfigParser

    cfg = os.path.join(bundle, config)
    meta = os.path.join(bundle, "configs", "metadata.json")
    for p in (cfg, meta):
        if not os.path.isfile(p):
            raise ExportError(f"{p}: missing (not a MONAI bundle?)")
    p = ConfigParser()
    try:
        p.read_config(cfg)
        p.read_meta(meta)
    except Exception as e:
        raise ExportError(f"{cfg}: cannot be read ({type(e).__name__}: {e})")
    p["bundle_root"] = os.path.abspath(bundle)
    return p


def parsed(p, key):
    try:
        return p.get_parsed_content(key, instantiate=True)
    except Exception as e:
        raise ExportError(f"bundle config: `{key}` cannot be instantiated ({type(e).__name__}: {e})")


def scalar(v):
    return float(np.asarray(v, dtype=np.float64).reshape(-1)[0])


def map_transform(t):
    """(manifest fields, note) for one preprocessing transform; fields None: not mapped."""
    name = type(t).__name__
    if name in NEUTRAL:
        return {}, None
    if name in ("ScaleIntensityRanged", "ScaleIntensityRange"):
        s = getattr(t, "scaler", t)
        a0, a1, b0, b1 = s.a_min, s.a_max, s.b_min, s.b_max
        if b0 is None or b1 is None or a1 == a0 or b1 == b0:
            return None, f"{name} without a finite output range"
        # (x - a0) / (a1 - a0) * (b1 - b0) + b0, clipped to [b0, b1] = (clip(x, a0, a1) - mean) / std
        std = (a1 - a0) / (b1 - b0)
        lo, hi = (min(a0, a1), max(a0, a1)) if s.clip else (-F32_MAX, F32_MAX)
        if std < 0:
            return None, f"{name} with a decreasing map (std < 0)"
        return {"normalize": normalize_table("ct", clip=[lo, hi], mean=a0 - b0 * std, std=std)}, None
    if name in ("NormalizeIntensityd", "NormalizeIntensity"):
        n = getattr(t, "normalizer", t)
        if n.nonzero:
            return None, f"{name}(nonzero=True): the manifest z-scores every voxel"
        if n.subtrahend is None and n.divisor is None:
            return {"normalize": {"kind": "zscore"}}, (
                None if n.channel_wise else "NormalizeIntensityd(channel_wise=False) pools the channels; voxtile "
                "z-scores each channel (the same for one channel)")
        if n.subtrahend is not None and n.divisor is not None:
            return {"normalize": normalize_table("ct", clip=[-F32_MAX, F32_MAX], mean=scalar(n.subtrahend),
                                                 std=scalar(n.divisor))}, None
        return None, f"{name} with only one of subtrahend / divisor"
    if name in ("ScaleIntensityRangePercentilesd", "ScaleIntensityRangePercentiles"):
        s = getattr(t, "scaler", t)
        if s.b_min == 0 and s.b_max == 1 and s.clip and not s.relative and not getattr(s, "channel_wise", False):
            return {"normalize": {"kind": "percentile", "p_lo": float(s.lower), "p_hi": float(s.upper)}}, None
        return None, f"{name} other than to [0, 1] with clip (the manifest's percentile kind)"
    if name in ("ScaleIntensityd", "ScaleIntensity"):
        s = getattr(t, "scaler", t)
        if s.minv == 0 and s.maxv == 1 and s.factor is None and not getattr(s, "channel_wise", False):
            return {"normalize": {"kind": "percentile", "p_lo": 0.0, "p_hi": 100.0}}, None
        return None, f"{name} other than min-max to [0, 1]"
    if name in ("Spacingd", "Spacing"):
        s = getattr(t, "spacing_transform", t)
        pix = np.atleast_1d(np.asarray(s.pixdim, dtype=np.float64))
        if pix.size == 1:
            pix = np.repeat(pix, 3)
        if pix.size < 3 or np.any(pix[:3] <= 0):
            return None, f"{name}(pixdim={list(pix)}) keeps some input spacings: not expressible"
        return {"spacing": [float(v) for v in pix[:3]]}, None
    if name in ("Orientationd", "Orientation"):
        o = getattr(t, "ornt_transform", t)
        return {"axcodes": o.axcodes}, None
    return None, name


def preprocessing_fields(p):
    """Manifest fields and warnings from the `preprocessing` Compose."""
    if "preprocessing" not in p:
        return {}, ["no `preprocessing` in the config: no normalisation or spacing mapped"], None
    pre = parsed(p, "preprocessing")
    transforms = getattr(pre, "transforms", [pre])
    fields, notes, unmapped, axcodes = {}, [], [], None
    for t in transforms:
        f, note = map_transform(t)
        if f is None:
            unmapped.append(note)
            continue
        if note:
            notes.append(note)
        if "axcodes" in f:
            axcodes = f.pop("axcodes")
        for k, v in f.items():
            if k in fields:
                unmapped.append(f"{type(t).__name__} (a second {k})")
            else:
                fields[k] = v
    if unmapped:
        notes.append("unmapped preprocessing (voxtile does not apply it): " + "; ".join(unmapped))
    return fields, notes, axcodes


def inferer_fields(p):
    """roi, overlap, blend (and notes on what the manifest lacks) from the `inferer`."""
    if "inferer" not in p:
        return {}, ["no `inferer` in the config: pass --roi"], []
    inf = parsed(p, "inferer")
    name = type(inf).__name__
    if name != "SlidingWindowInferer":
        return {}, [f"inferer {name}: not a sliding window; voxtile windows the volume (pass --roi)"], []
    roi = [int(v) for v in np.atleast_1d(inf.roi_size)]
    if len(roi) == 1:
        roi = roi * 3
    mode = str(getattr(inf.mode, "value", inf.mode))
    if mode not in ("gaussian", "constant"):
        raise ExportError(f"inferer: blend mode {mode!r} has no voxtile equivalent")
    overlap = [float(v) for v in np.atleast_1d(inf.overlap)]
    sigma = [float(s) for s in np.atleast_1d(inf.sigma_scale)]
    # SlidingWindowInferer: MONAI's placement, no test-time mirroring.
    fields = {"roi": roi, "overlap": overlap[0] if len(overlap) == 1 else overlap, "blend": mode,
              "placement": "monai", "tta": False, "sigma_scale": sigma[0] if len(sigma) == 1 else sigma}
    notes, flags = [f"sw_batch_size {inf.sw_batch_size}: voxtile chooses its own batch (no effect on outputs)"], []
    pad = str(getattr(inf.padding_mode, "value", inf.padding_mode))
    if pad == "constant":
        fields["pad"] = float(inf.cval)
    elif pad == "replicate":
        fields["pad"] = "edge"
    else:
        notes.append(f"inferer padding_mode {pad}: voxtile pads with a constant or 'edge' (--pad)")
    return fields, notes, flags


def activation_of(p):
    """softmax / sigmoid when postprocessing activates before inverting the spatial transforms (the
    probabilities are resampled), none when it inverts the logits first (or does not activate)."""
    if "postprocessing" not in p:
        return "auto"
    post = parsed(p, "postprocessing")
    act, inverted = None, False
    for t in getattr(post, "transforms", [post]):
        n = type(t).__name__
        if n in ("Invertd", "Invert"):
            inverted = True
        if n in ("Activationsd", "Activations") and act is None:
            a = getattr(t, "converter", t)
            sm, sg = a.softmax, a.sigmoid
            sm = sm[0] if isinstance(sm, (list, tuple)) else sm
            sg = sg[0] if isinstance(sg, (list, tuple)) else sg
            act = ("softmax" if sm else "sigmoid" if sg else "none") if not inverted else "none"
    return act or "none"


def classes_of(p, cout):
    fmt = p.get("_meta_#network_data_format#outputs", {}) or {}
    out = next(iter(fmt.values()), {}) if fmt else {}
    cdef = out.get("channel_def") or {}
    names = [cdef.get(str(i), cdef.get(i)) for i in range(cout)]
    if any(n is None for n in names):
        return None
    return [str(n) for n in names]


def load_weights(net, path):
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ExportError(f"{path}: not a readable state dict ({type(e).__name__}: {e})")
    if isinstance(sd, dict) and "model" in sd and isinstance(sd["model"], dict):
        sd = sd["model"]  # CheckpointSaver's {"model": state_dict}
    try:
        net.load_state_dict(sd)
    except RuntimeError as e:
        raise ExportError(f"{path}: weights do not fit network_def: {str(e).splitlines()[0]}")


def run(a):
    p = parser_for(a.bundle, a.config)
    weights = os.path.join(a.bundle, a.weights)
    if not os.path.isfile(weights):
        raise ExportError(f"{weights}: missing")
    base, _ = output_paths(a.output, a.force, [a.bundle, weights])
    key = "network_def" if "network_def" in p else "network"
    net = parsed(p, key)
    if not isinstance(net, torch.nn.Module):
        raise ExportError(f"bundle config: `{key}` is not a torch module")
    load_weights(net, weights)
    net = First(net.eval())
    fields, notes, axcodes = preprocessing_fields(p)
    inf_fields, inf_notes, flags = inferer_fields(p)
    fields.update(inf_fields)
    notes += inf_notes
    roi = fields.get("roi") or [96, 96, 96]
    cin = int(next(iter((p.get("_meta_#network_data_format#inputs", {}) or {"": {}}).values()))
              .get("num_channels", 1))
    with torch.no_grad():
        cout = net(torch.zeros(1, cin, *roi)).shape[1]
    fields = {"name": p.get("_meta_#name", os.path.basename(os.path.abspath(a.bundle))),
              "classes": classes_of(p, cout), "axis_order": "xyz", **fields, "activation": activation_of(p)}
    codes = str(axcodes or "").upper()
    if len(codes) == 3 and sorted("LRAPSI".index(c) // 2 for c in codes if c in "LRAPSI") == [0, 1, 2]:
        fields["orientation"] = codes
    elif axcodes:
        notes.insert(0, f"Orientationd(axcodes={axcodes}): not three axis codes; give voxtile inputs already "
                        f"in that voxel order")
    if "spacing" in fields:
        notes.append("Spacingd resamples in world coordinates (MONAI's grid); voxtile resamples voxel centres "
                     "over the same field of view, trilinearly, after the normalisation")
    for n in notes:
        warn(n)
    comments = [f"voxtile manifest written by scripts/monai_bundle_to_voxtile.py from {os.path.abspath(a.bundle)}",
                f"run: voxtile segment IN.nii.gz --model {os.path.basename(base)}.onnx -o OUT.nii.gz "
                + " ".join(flags), *notes]
    tmp = export_onnx(net, cin, roi, base + ".onnx", dynamo=a.dynamo)
    if not a.no_check:
        rel = check_onnx(net, tmp, cin, roi)
        print(f"{os.path.basename(base)}.onnx: onnxruntime vs PyTorch on one window: rel L2 {rel:.2e}")
        if not rel < 1e-4:
            os.remove(tmp)
            raise ExportError(f"{base}.onnx: onnxruntime disagrees with PyTorch (rel L2 {rel:.2e}); not written")
    write_outputs([(base + ".onnx", tmp), (base + ".toml", manifest_toml(fields, comments))])
    print(comments[1])
    print(f"wrote {base}.onnx, {base}.toml")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("bundle", help="the bundle folder (configs/, models/)")
    ap.add_argument("-o", "--output", required=True, help="NAME: writes NAME.onnx and NAME.toml")
    ap.add_argument("--config", default=os.path.join("configs", "inference.json"))
    ap.add_argument("--weights", default=os.path.join("models", "model.pt"))
    ap.add_argument("--dynamo", action="store_true", help="torch.onnx's dynamo exporter (default: legacy, opset 17)")
    ap.add_argument("--no-check", action="store_true", help="skip the onnxruntime check of the export")
    ap.add_argument("--force", action="store_true", help="overwrite NAME.onnx / NAME.toml")
    a = ap.parse_args(argv)
    try:
        run(a)
    except ExportError as e:
        fail(str(e))


if __name__ == "__main__":
    main()
