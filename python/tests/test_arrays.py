"""Layouts and dtypes: float32 read in place whatever its strides, float16 and int16 converted;
each gives the labels of the same values as a plain float32 array."""
import numpy as np
import pytest

import voxtile


@pytest.fixture(scope="module")
def small(shared):
    return voxtile.Model(shared / "models" / "monai_unet_small.onnx", device="cpu", roi=32,
                         allow_small_roi=True)


@pytest.fixture(scope="module")
def volume():
    rng = np.random.default_rng(7)
    return rng.integers(-200, 200, size=(40, 36, 33)).astype(np.float32)


def test_strides_do_not_change_the_labels(small, volume):
    want = small.segment(np.ascontiguousarray(volume))
    assert np.array_equal(small.segment(np.asfortranarray(volume)), want)
    flipped = np.ascontiguousarray(volume[::-1])[::-1]  # a view with a negative stride
    assert not flipped.flags.c_contiguous
    assert np.array_equal(small.segment(flipped), want)


def test_int16_and_float16_are_their_float32_values(small, volume):
    want = small.segment(volume)
    assert np.array_equal(small.segment(volume.astype(np.int16)), want)
    half = volume.astype(np.float16)
    assert np.array_equal(small.segment(half), small.segment(half.astype(np.float32)))


def test_channel_axis_optional(small, volume):
    assert np.array_equal(small.segment(volume[np.newaxis]), small.segment(volume))


def test_spacing_and_affine_geometry(shared, volume, tmp_path):
    # A model that resamples needs the array's voxel size; with it, the grid comes back.
    manifest = tmp_path / "m.toml"
    manifest.write_text("spacing = [2.0, 2.0, 2.0]\n")
    m = voxtile.Model(shared / "models" / "monai_unet_small.onnx", device="cpu", roi=32,
                      allow_small_roi=True, manifest=manifest)
    with pytest.raises(voxtile.InvalidInput, match="spacing or affine"):
        m.segment(volume)
    labels = m.segment(volume, spacing=(1.0, 1.0, 1.0))
    assert labels.shape == volume.shape
    assert np.array_equal(m.segment(volume, affine=np.eye(4)), labels)
