"""Reference sliding windows in PyTorch for scripts/test_exports.py: MONAI's sliding_window_inference, and
nnU-Net v2's predictor algorithm (nnunetv2 2.8 `nnUNetPredictor._internal_predict_sliding_window_return_logits`
restated without its dependencies): zero padding up to the patch, `compute_steps_for_sliding_window`,
per-window mirroring (`_internal_maybe_mirror_and_predict`), `compute_gaussian` and its accumulators."""
import itertools

import numpy as np
import torch


def monai_logits(net, x, roi, overlap=0.5, sigma_scale=0.125, mode="gaussian"):
    """(C, D, H, W) blended logits of `net` over `x` (D, H, W) by MONAI's sliding_window_inference."""
    from monai.inferers import sliding_window_inference

    with torch.no_grad():
        y = sliding_window_inference(torch.from_numpy(x)[None, None].float(), list(roi), 4, net, overlap=overlap,
                                     mode=mode, sigma_scale=sigma_scale, padding_mode="constant", cval=0.0)
    return y[0].numpy()


def nnunet_steps(size, tile, step=0.5):
    """nnU-Net's compute_steps_for_sliding_window for one axis."""
    n = int(np.ceil((size - tile) / (tile * step))) + 1
    if n == 1:
        return [0]
    return [int(np.round((size - tile) / (n - 1) * i)) for i in range(n)]


def nnunet_gaussian(tile, sigma_scale=1 / 8, value_scaling=10.0):
    """nnU-Net's compute_gaussian: an impulse at n // 2 through scipy's gaussian_filter (truncated at
    int(4 sigma + 0.5)), over its maximum, times 10, zeros replaced by the smallest non-zero value;
    separable, so exp(-x^2 / 2 sigma^2) per axis."""
    prof = []
    for n in tile:
        s = n * sigma_scale
        r = int(4 * s + 0.5)
        x = np.arange(n) - n // 2
        prof.append(np.where(np.abs(x) <= r, np.exp(-0.5 * x * x / (s * s)), 0.0))
    g = prof[0][:, None, None] * prof[1][None, :, None] * prof[2][None, None, :]
    g = g / g.max() * value_scaling
    g[g == 0] = g[g != 0].min()  # as compute_gaussian does
    return torch.from_numpy(g)


def monai_gaussian(tile, sigma_scale=0.125):
    from monai.data.utils import compute_importance_map

    return compute_importance_map(list(tile), mode="gaussian", sigma_scale=sigma_scale, device="cpu").double()


def nnunet_windows(net, x, tile, mirror_axes, step=0.5):
    """Every window's mirrored-and-averaged logits (nnU-Net's padding, steps and mirroring), computed once so
    that several blends can be measured: (padded shape, padding before, [(slices, logits)])."""
    size = x.shape
    pad = [max(t - s, 0) for s, t in zip(size, tile)]
    before = [p // 2 for p in pad]
    data = np.pad(x, [(b, p - b) for b, p in zip(before, pad)])
    steps = [nnunet_steps(s, t, step) for s, t in zip(data.shape, tile)]
    axes_sets = [c for i in range(len(mirror_axes)) for c in itertools.combinations([m + 2 for m in mirror_axes], i + 1)]
    t = torch.from_numpy(data).float()[None, None]
    out = []
    with torch.no_grad():
        for sx, sy, sz in itertools.product(*steps):
            sl = (slice(sx, sx + tile[0]), slice(sy, sy + tile[1]), slice(sz, sz + tile[2]))
            w = t[(slice(None), slice(None), *sl)]
            p = net(w)
            for axes in axes_sets:
                p += torch.flip(net(torch.flip(w, axes)), axes)
            p /= len(axes_sets) + 1
            out.append((sl, p[0]))
    return data.shape, before, size, out


def nnunet_blend(windows, tile, gaussian="nnunet", acc=torch.float32):
    """(C, D, H, W) logits blended as nnU-Net does. `gaussian`: "nnunet" (its map) or "monai" (MONAI's, what
    voxtile uses); `acc`: the accumulators' dtype (nnU-Net 2.8 uses float16, its gaussian included)."""
    shape, before, size, preds = windows
    g = (nnunet_gaussian(tile) if gaussian == "nnunet" else monai_gaussian(tile)).to(acc)
    if acc == torch.float16:
        g[g == 0] = g[g != 0].min()
    logits = torch.zeros((preds[0][1].shape[0], *shape), dtype=acc)
    weight = torch.zeros(shape, dtype=acc)
    for sl, p in preds:
        logits[(slice(None), *sl)] += p * g  # computed in fp32, stored in acc
        weight[sl] += g
    out = (logits / weight).float()
    crop = tuple(slice(b, b + s) for b, s in zip(before, size))
    return out[(slice(None), *crop)].numpy()
