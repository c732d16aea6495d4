"""What both converters share: refusing to overwrite, the ONNX export (checked with onnxruntime) and
the voxtile manifest as TOML (voxtile's fields only: src/pipeline/manifest.rs)."""
import json
import math
import os
import sys

import numpy as np
import torch


class First(torch.nn.Module):
    """The first (full-resolution) output of a net that returns a list or tuple (deep supervision)."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x):
        y = self.net(x)
        return y[0] if isinstance(y, (list, tuple)) else y


class ExportError(Exception):
    """One line for the user: the file and the problem."""


def fail(msg):
    """Print one error line and exit 1 (no traceback, nothing written)."""
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(1)


def warn(msg):
    print(f"warning: {msg}", file=sys.stderr)


def output_paths(name, force, inputs, extra=()):
    """NAME.onnx and NAME.toml (plus `extra` suffixes); refused when one exists (without --force)
    or is an input."""
    base = name[:-5] if name.endswith(".onnx") else name
    paths = [base + ".onnx", base + ".toml", *[base + e for e in extra]]
    real_inputs = {os.path.realpath(p) for p in inputs}
    for p in paths:
        if os.path.realpath(p) in real_inputs:
            raise ExportError(f"{p}: is an input; choose another -o")
        if os.path.exists(p) and not force:
            raise ExportError(f"{p}: exists; pass --force to overwrite it")
        parent = os.path.dirname(os.path.abspath(p))
        if not os.path.isdir(parent):
            raise ExportError(f"{p}: folder {parent} does not exist")
    return base, paths


def export_onnx(net, in_channels, roi, path, dynamo=False, opset=17):
    """torch.onnx.export of `net` (eval, fp32) with input `input` (N,C,D,H,W) and output `output`;
    legacy exporter with dynamic N,D,H,W by default. Written to a temp file, renamed at the end."""
    net = net.eval()
    x = torch.randn(1, in_channels, *roi)
    names = dict(input_names=["input"], output_names=["output"])
    tmp = path + ".part"
    with torch.no_grad():
        if dynamo:
            from torch.export import Dim

            shapes = {"x": {0: Dim.AUTO, 2: Dim.AUTO, 3: Dim.AUTO, 4: Dim.AUTO}}
            try:
                prog = torch.onnx.export(net, (x,), dynamo=True, dynamic_shapes=shapes, **names)
            except Exception as e:  # some nets specialise their shapes: say so, export static
                warn(f"dynamo export with dynamic shapes failed ({type(e).__name__}); exporting a fixed shape")
                prog = torch.onnx.export(net, (x,), dynamo=True, **names)
            prog.save(tmp, external_data=False)
        else:
            axes = {n: {0: "n", 2: "d", 3: "h", 4: "w"} for n in ("input", "output")}
            torch.onnx.export(net, (x,), tmp, opset_version=opset, dynamo=False, dynamic_axes=axes, **names)
    return tmp


def check_onnx(net, tmp, in_channels, roi, seed=0):
    """onnxruntime against PyTorch on one random window: the rel L2 (the export's own check)."""
    import onnxruntime as ort

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, in_channels, *roi, generator=g)
    with torch.no_grad():
        ref = net.eval()(x).numpy()
    sess = ort.InferenceSession(tmp, providers=["CPUExecutionProvider"])
    got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))


def _toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ExportError(f"manifest value {v} is not finite")
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(type(v))


def manifest_toml(fields, comments=()):
    """TOML text of a manifest: scalars and lists first, then the [normalize] and [remap] tables.
    `comments` go on top (what the manifest cannot say, and the command to run)."""
    lines = [f"# {c}" for c in comments]
    tables = {}
    for k, v in fields.items():
        if v is None:
            continue
        if isinstance(v, dict):
            tables[k] = v
        else:
            lines.append(f"{k} = {_toml_value(v)}")
    for k, t in tables.items():
        lines.append("")
        lines.append(f"[{k}]")
        lines.extend(f"{kk} = {_toml_value(vv)}" for kk, vv in t.items())
    return "\n".join(lines) + "\n"


def write_outputs(files):
    """`files`: [(final path, temp path or text)]; text is written to a temp file first. Every temp
    file is renamed only once all exist, so a failure leaves no output."""
    staged = []
    try:
        for final, content in files:
            if isinstance(content, str) and content.endswith(".part") and os.path.exists(content):
                staged.append((content, final))
            else:
                tmp = final + ".part"
                with open(tmp, "w") as f:
                    f.write(content)
                staged.append((tmp, final))
    except BaseException:
        for tmp, _ in staged:
            os.remove(tmp)
        raise
    for tmp, final in staged:
        os.replace(tmp, final)


def normalize_table(kind, **kw):
    """The manifest's [normalize] table (voxtile reads the numbers as f32)."""
    t = {"kind": kind}
    for k, v in kw.items():
        t[k] = [float(x) for x in v] if isinstance(v, (list, tuple)) else float(v)
    return t
