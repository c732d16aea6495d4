"""Rebuild data/head_t1_128.nii.gz, the README's sample: a T1 head WITH skull for deepbrain.

Source: `mean_reg2mean.nii.gz`, the mean T1 head (176x256x256, ~1 mm, skull and face kept)
shipped in the PyPI package pydeface 2.1.0 (MIT, see LICENSE-sample). Get it with
    pip download --no-deps pydeface==2.1.0 && unzip pydeface-2.1.0-py3-none-any.whl 'pydeface/data/*'
then run
    python data/make_sample.py pydeface/data/mean_reg2mean.nii.gz data/head_t1_128.nii.gz
(needs numpy and nibabel only).

deepbrain's own preprocessing, redone in numpy: skimage `resize(img, (128,)*3, mode="constant",
anti_aliasing=True)` (Gaussian blur, sigma = (factor - 1) / 2 per axis, then linear
interpolation at voxel centres, zero outside), then divided by the maximum. The affine is
scaled to match (same field of view), so the labels overlay the source in world space.
Stored as uint8 with scl_slope 1/255: readers see values in [0, 1], the file stays small.
"""
import sys
import numpy as np
import nibabel as nib

SHAPE = (128, 128, 128)


def gaussian_1d(v, sigma, axis):
    """Blur along `axis` with a Gaussian truncated at 4 sigma, zero outside (scipy 'constant')."""
    if sigma <= 0:
        return v
    r = int(4.0 * sigma + 0.5)
    x = np.arange(-r, r + 1)
    k = np.exp(-0.5 * (x / sigma) ** 2)
    k /= k.sum()
    return np.apply_along_axis(lambda line: np.convolve(line, k, mode="same"), axis, v)


def linear_1d(v, n_out, axis):
    """Resample `axis` to `n_out` points at voxel centres, linear, zero beyond the edges."""
    n = v.shape[axis]
    pos = (np.arange(n_out) + 0.5) * (n / n_out) - 0.5
    padded = np.concatenate(
        [np.zeros_like(np.take(v, [0], axis)), v, np.zeros_like(np.take(v, [0], axis))], axis)
    p = np.clip(pos + 1.0, 0.0, n + 1.0)  # index into the zero-padded array
    lo = np.minimum(np.floor(p).astype(int), n)
    f = (p - lo).reshape([-1 if a == axis else 1 for a in range(v.ndim)])
    return np.take(padded, lo, axis) * (1 - f) + np.take(padded, lo + 1, axis) * f


def main(src, dst):
    img = nib.load(src)
    v = np.asarray(img.dataobj, dtype=np.float64)
    factors = [n / m for n, m in zip(v.shape, SHAPE)]
    for a, f in enumerate(factors):
        v = gaussian_1d(v, max(0.0, (f - 1) / 2), a)
    for a in range(3):
        v = linear_1d(v, SHAPE[a], a)
    v = np.clip(v, 0, None) / v.max()
    # New voxel i sits at old index (i + 0.5) * f - 0.5.
    scale = np.diag(factors + [1.0])
    scale[:3, 3] = [(f - 1) / 2 for f in factors]
    out = nib.Nifti1Image(np.round(v * 255).astype(np.uint8), img.affine @ scale)
    out.header.set_slope_inter(1 / 255, 0)
    out.header["descrip"] = b"pydeface mean_reg2mean 128^3 / max"
    out.set_qform(out.affine, code=1)
    out.set_sform(out.affine, code=1)
    nib.save(out, dst)


if __name__ == "__main__":
    main(*sys.argv[1:3])
