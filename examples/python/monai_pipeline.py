"""A MONAI-style dictionary-transform pipeline that hands its arrays to voxtile: load, channels
first, segment (voxtile in place of MONAI's inferer), save. With MONAI installed it uses MONAI's
own LoadImaged / EnsureChannelFirstd / Compose (the image is a MetaTensor, read through DLPack);
without it, the few equivalents below (nibabel) keep the same dictionaries flowing.

usage: python examples/python/monai_pipeline.py IMAGE.nii.gz MODEL.onnx OUT.nii.gz [--device cpu]
"""
import argparse

import nibabel as nib
import numpy as np

import voxtile


class VoxtileSegmentd:
    """A MONAI-style map transform: segments ``data[key]`` ((C, i, j, k), channels first) with a
    voxtile model loaded once, and puts the label map under ``label_key``. The affine comes with
    the image (a MetaTensor's ``.affine``) or from ``data[key + "_meta_dict"]["affine"]``, so the
    labels are those ``voxtile segment`` writes for the file."""

    def __init__(self, keys, model, label_key="label"):
        self.keys, self.model, self.label_key = keys, model, label_key

    def __call__(self, data):
        d = dict(data)
        for key in self.keys:
            image = d[key]
            affine = getattr(image, "affine", None)
            if affine is None:
                affine = d[f"{key}_meta_dict"]["affine"]
            d[self.label_key] = self.model.segment(image, affine=np.asarray(affine))
            d[f"{self.label_key}_affine"] = np.asarray(affine)
        return d


class LoadImaged:
    """MONAI's LoadImaged (nibabel reader) for NIfTI: the array as stored, float32, its affine."""

    def __init__(self, keys):
        self.keys = keys

    def __call__(self, data):
        d = dict(data)
        for key in self.keys:
            img = nib.load(d[key])
            d[key] = np.asarray(img.dataobj, dtype=np.float32)
            d[f"{key}_meta_dict"] = {"affine": img.affine, "filename_or_obj": data[key]}
        return d


class EnsureChannelFirstd:
    """MONAI's EnsureChannelFirstd for NIfTI: a 3-D image gets a channel axis, a 4-D one's last
    axis (NIfTI's 4th dimension) goes first."""

    def __init__(self, keys):
        self.keys = keys

    def __call__(self, data):
        d = dict(data)
        for key in self.keys:
            x = d[key]
            d[key] = x[np.newaxis] if x.ndim == 3 else np.moveaxis(x, -1, 0)
        return d


class Compose:
    """MONAI's Compose: each transform on the output of the one before."""

    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, data):
        for t in self.transforms:
            data = t(data)
        return data


def transforms(model):
    """The pipeline: MONAI's transforms when MONAI is installed, the equivalents above otherwise."""
    try:
        from monai.transforms import Compose as MCompose
        from monai.transforms import EnsureChannelFirstd as MEnsure
        from monai.transforms import LoadImaged as MLoad
    except ImportError:
        return Compose([LoadImaged(["image"]), EnsureChannelFirstd(["image"]),
                        VoxtileSegmentd(["image"], model)])
    return MCompose([MLoad(["image"], image_only=True, dtype=np.float32), MEnsure(["image"]),
                     VoxtileSegmentd(["image"], model)])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("image")
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--device", default="auto")
    a = ap.parse_args()
    model = voxtile.Model(a.model, device=a.device)
    out = transforms(model)({"image": a.image})
    labels = out["label"]
    nib.save(nib.Nifti1Image(labels, out["label_affine"]), a.out)
    print(f"{a.image} -> {a.out}: labels {sorted(np.unique(labels).tolist())}, shape {labels.shape}")


if __name__ == "__main__":
    main()
