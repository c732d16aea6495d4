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
