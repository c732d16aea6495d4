"""voxtile.sliding_window_inference against MONAI's on the shared fixtures (MONAI 1.6.1's outputs
stored with them), with the Rust tests' tolerance."""
import json

import numpy as np
import pytest

import voxtile

# tests/sliding_window.rs: relative L2 error against MONAI.
TOLERANCE = 1e-5


def cases(shared):
    return json.loads((shared / "sliding_window" / "index.json").read_text())


def rel_l2(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_matches_monai_on_every_fixture(shared):
    index = cases(shared)
    assert len(index) >= 3
    for c in index:
        x = np.load(shared / "sliding_window" / c["input"])
        want = np.load(shared / "sliding_window" / c["output"])
        assert c["padding_mode"] == "constant"
        got = voxtile.sliding_window_inference(
            x, shared / "models" / c["model"], roi_size=c["roi"], overlap=c["overlap"],
            mode=c["mode"], sigma_scale=c["sigma_scale"], cval=c["cval"], device="cpu")
        assert got.shape == want.shape and got.dtype == np.float32
        e = rel_l2(got, want)
        assert e <= TOLERANCE, f"{c['id']}: rel L2 {e:.3e}"


def test_a_model_keeps_its_engine_and_items_stack(shared):
    c = cases(shared)[0]
    x = np.load(shared / "sliding_window" / c["input"])
    want = np.load(shared / "sliding_window" / c["output"])
    m = voxtile.Model(shared / "models" / c["model"], device="cpu")
    kw = dict(roi_size=c["roi"], overlap=c["overlap"], mode=c["mode"],
              sigma_scale=c["sigma_scale"])
    two = voxtile.sliding_window_inference(np.concatenate([x, x]), m, **kw)
    assert two.shape == (2,) + want.shape[1:]
    assert rel_l2(two[1:], want) <= TOLERANCE and np.array_equal(two[0], two[1])
    one = voxtile.sliding_window_inference(x[0], m, **kw)  # (C, D, H, W) in, out
    assert np.array_equal(one, two[0])
    assert len(m._windows) == 1


def test_torch_cpu_tensor_in_place(shared):
    torch = pytest.importorskip("torch")
    c = cases(shared)[0]
    x = np.load(shared / "sliding_window" / c["input"])
    want = np.load(shared / "sliding_window" / c["output"])
    got = voxtile.sliding_window_inference(
        torch.from_numpy(x), shared / "models" / c["model"], roi_size=c["roi"],
        overlap=c["overlap"], mode=c["mode"], sigma_scale=c["sigma_scale"], device="cpu")
    assert isinstance(got, torch.Tensor)
    assert rel_l2(got.numpy(), want) <= TOLERANCE


def test_a_dlpack_tensor_is_read_in_place(shared):
    c = cases(shared)[0]
    x = np.load(shared / "sliding_window" / c["input"])
    want = np.load(shared / "sliding_window" / c["output"])

    class Tensor:  # a CPU tensor of another library, seen only through DLPack
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kw):
            return self.a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    host, _ = voxtile._host_array(Tensor(x))
    assert np.shares_memory(host, x)
    got = voxtile.sliding_window_inference(
        Tensor(x), shared / "models" / c["model"], roi_size=c["roi"], overlap=c["overlap"],
        mode=c["mode"], sigma_scale=c["sigma_scale"], device="cpu")
    assert rel_l2(got, want) <= TOLERANCE


def _cuda_torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch


def test_a_cuda_tensor_is_read_on_the_device(shared):
    """A float32 CUDA tensor, contiguous or a permuted view, goes in without a host copy (the
    windows are gathered from it on the GPU) and gives what the same values from the host give;
    the result is a tensor on that device."""
    torch = _cuda_torch()
    for c in cases(shared):
        x = np.load(shared / "sliding_window" / c["input"])
        want = np.load(shared / "sliding_window" / c["output"])
        model = voxtile.Model(shared / "models" / c["model"], device="cuda:0")
        kw = dict(roi_size=c["roi"], overlap=c["overlap"], mode=c["mode"],
                  sigma_scale=c["sigma_scale"], cval=c["cval"])
        host = voxtile.sliding_window_inference(x, model, **kw)
        stored = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 1, 4, 3, 2))).cuda()
        for name, t in [("contiguous", torch.from_numpy(x).cuda()),
                        ("strided", stored.permute(0, 1, 4, 3, 2))]:
            got = voxtile.sliding_window_inference(t, model, **kw)
            assert isinstance(got, torch.Tensor) and got.is_cuda, name
            assert got.dtype == torch.float32 and tuple(got.shape) == want.shape, name
            g = got.cpu().numpy()
            print(f"RESULT {c['id']} {name}: bitwise {np.array_equal(g, host)}, "
                  f"rel L2 to the host input {rel_l2(g, host):.2e}, to MONAI {rel_l2(g, want):.2e}")
            assert rel_l2(g, host) <= 1e-3, f"{c['id']} {name}"
            assert rel_l2(g, want) <= 1e-2, f"{c['id']} {name}"  # the fp16 bar


def test_cuda_tensors_that_cannot_be_read_in_place_are_refused(shared):
    torch = _cuda_torch()
    c = cases(shared)[0]
    x = torch.from_numpy(np.load(shared / "sliding_window" / c["input"])).cuda()
    path = shared / "models" / c["model"]
    kw = dict(roi_size=c["roi"], overlap=c["overlap"])
    with pytest.raises(voxtile.InvalidInput, match="float32"):
        voxtile.sliding_window_inference(x.half(), path, device="cuda:0", **kw)
    with pytest.raises(voxtile.InvalidInput, match="runs on"):
        voxtile.sliding_window_inference(x, path, device="cpu", **kw)
    with pytest.raises(voxtile.InvalidInput, match="sliding_window_inference"):
        voxtile.Model(path, device="cuda:0").segment(x[0])
