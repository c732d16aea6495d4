"""Helpers of scripts/test_exports.py: a CT-like test volume, running voxtile, agreement figures."""
import os
import subprocess

import nibabel as nib
import numpy as np

# The bars per backend, (logits rel L2 at most, labels agree % at least): the CPU (f32) is the exact
# reference; CUDA computes in fp16 (tests/it/model/archs.rs holds it to the same 1e-2 and 99.8 %).
BARS = {"cpu": (1e-5, 99.99), "cuda": (1e-2, 99.8)}


def ct_volume(path, shape_ijk, spacing_ijk, seed=0):
    """A CT-like volume: air, a body ellipsoid (~40 HU), an organ (~100 HU), bone (~700 HU), noise."""
    rng = np.random.default_rng(seed)
    i, j, k = np.meshgrid(*[np.linspace(-1, 1, n) for n in shape_ijk], indexing="ij")
    v = np.full(shape_ijk, -1000.0)
    body = (i / 0.85) ** 2 + (j / 0.7) ** 2 < 1.0
    v[body] = 40.0
    v[((i - 0.25) / 0.35) ** 2 + ((j + 0.1) / 0.3) ** 2 + (k / 0.6) ** 2 < 1] = 100.0
    v[((i + 0.3) ** 2 + (j - 0.3) ** 2 < 0.02)] = 700.0
    v += rng.normal(0, 25, shape_ijk)
    aff = np.diag([*spacing_ijk, 1.0])
    nib.save(nib.Nifti1Image(v.astype(np.float32), aff), path)
    return v.astype(np.float32)


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}{r.stderr}")
    return r.stdout + r.stderr


def voxtile_logits(voxtile, vol, model, out_dir, tag, extra=(), device="cpu"):
    """labels (i,j,k) and logits (C,i,j,k) of one `voxtile segment` run on `device` (cpu, cuda)."""
    seg, lg = os.path.join(out_dir, f"{tag}_seg.nii.gz"), os.path.join(out_dir, f"{tag}_logits.nii")
    run([voxtile, "segment", vol, "--model", model, "-o", seg, "--logits", lg, "--device", device, "--force",
         *extra])
    labels = np.asarray(nib.load(seg).dataobj).astype(np.int64)
    logits = np.moveaxis(np.asarray(nib.load(lg).dataobj, dtype=np.float32), -1, 0)
    return labels, logits


def rel_l2(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def agree(a, b):
    return float((a == b).mean() * 100)
