"""Bad arrays and arguments: one clear exception of the library's kinds, never a panic."""
import numpy as np
import pytest

import voxtile


@pytest.fixture(scope="module")
def small(shared):
    return voxtile.Model(shared / "models" / "monai_unet_small.onnx", device="cpu", roi=32,
                         allow_small_roi=True)


def test_kinds_share_a_base():
    for kind in (voxtile.BudgetTooSmall, voxtile.UnsupportedOps, voxtile.ChannelMismatch,
                 voxtile.InvalidInput, voxtile.Cancelled, voxtile.ModelError, voxtile.IoError):
        assert issubclass(kind, voxtile.VoxtileError)


@pytest.mark.parametrize("shape", [(2, 3), (4,), (1, 1, 8, 8, 8)])
def test_wrong_dimensions(small, shape):
    with pytest.raises(voxtile.InvalidInput, match=r"\(D, H, W\) or \(C, D, H, W\)"):
        small.segment(np.zeros(shape, np.float32))


def test_nan_is_refused_unless_cleaned(small):
    x = np.zeros((20, 20, 20), np.float32)
    x[3, 4, 5] = np.nan
    x[6, 7, 8] = np.inf
    with pytest.raises(voxtile.InvalidInput, match="2 NaN or infinite"):
        small.segment(x)
    assert small.segment(x, nonfinite="clean").shape == x.shape


def test_wrong_channels(small):
    with pytest.raises(voxtile.ChannelMismatch, match="expects 1") as e:
        small.segment(np.zeros((3, 20, 20, 20), np.float32))
    assert (e.value.expected, e.value.got) == (1, 3)
    with pytest.raises(voxtile.ChannelMismatch, match="channels come first"):
        small.segment(np.zeros((3, 20, 20, 1), np.float32))


def test_bad_affine_and_dtype(small):
    x = np.zeros((20, 20, 20), np.float32)
    with pytest.raises(voxtile.InvalidInput, match="4x4"):
        small.segment(x, affine=np.eye(3))
    with pytest.raises(voxtile.InvalidInput, match="last row"):
        small.segment(x, affine=np.ones((4, 4)))
    with pytest.raises(voxtile.InvalidInput, match="numeric"):
        small.segment(np.zeros((20, 20, 20), dtype="U1"))


def test_bad_flags(shared):
    path = shared / "models" / "monai_unet_small.onnx"
    with pytest.raises(voxtile.InvalidInput, match="overlap"):
        voxtile.Model(path, device="cpu", overlap=1.5)
    with pytest.raises(voxtile.InvalidInput, match="--no-such-flag"):
        voxtile.Model(path, device="cpu", no_such_flag=1)
    with pytest.raises(voxtile.InvalidInput, match="segment_file"):
        voxtile.Model(path, device="cpu", preview="p.png")
    with pytest.raises(voxtile.VoxtileError):
        voxtile.Model(path.with_name("missing.onnx"), device="cpu")


def test_budget_too_small_carries_its_numbers(shared):
    m = voxtile.Model(shared / "models" / "monai_unet_small.onnx", device="cpu", roi=32,
                      memory_budget="1KiB", allow_small_roi=True)
    with pytest.raises(voxtile.BudgetTooSmall) as e:
        m.segment(np.zeros((40, 40, 40), np.float32))
    assert e.value.budget == 1024 and e.value.needed > 1024 and e.value.roi == [32, 32, 32]


def test_a_cuda_tensor_is_refused_not_copied(small):
    class CudaTensor:  # what torch.Tensor.__dlpack_device__ says on a GPU
        def __dlpack_device__(self):
            return (2, 0)

    with pytest.raises(voxtile.InvalidInput, match="GPU"):
        small.segment(CudaTensor())
