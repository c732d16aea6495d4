"""Arrays through Model.segment against what the command line writes for the file (bitwise)."""
import threading

import numpy as np
import pytest

import voxtile
from conftest import DEEPBRAIN, SAMPLE


def test_array_with_affine_gives_the_cli_labels(deepbrain, sample, cli_labels):
    x, affine = sample
    labels = deepbrain.segment(x, affine=affine)
    assert labels.dtype == np.uint8
    assert labels.shape == cli_labels.shape
    assert np.array_equal(labels, cli_labels)
    assert 0 < labels.sum() < labels.size  # a real segmentation, not an empty one


def test_segment_file_writes_what_the_cli_writes(tmp_path, cli_labels):
    nib = pytest.importorskip("nibabel")
    out = tmp_path / "api.nii.gz"
    voxtile.segment_file(SAMPLE, out, DEEPBRAIN, device="cpu", report=tmp_path / "r.json")
    assert np.array_equal(np.asarray(nib.load(out).dataobj), cli_labels)
    assert (tmp_path / "r.json").stat().st_size > 0


def test_two_threads_share_one_model(deepbrain, sample, cli_labels):
    x, affine = sample
    got = [None, None]

    def run(i):
        got[i] = deepbrain.segment(x, affine=affine)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for labels in got:
        assert np.array_equal(labels, cli_labels)


def test_outputs_on_request(deepbrain, sample, cli_labels):
    x, affine = sample
    r = deepbrain.segment(x, affine=affine, probabilities=True, logits=True)
    assert np.array_equal(r.labels, cli_labels)
    assert r.probabilities.shape == (1,) + x.shape and r.logits.shape == (1,) + x.shape
    # One sigmoid channel: label 1 exactly where the probability passes 0.5.
    assert np.array_equal(r.labels == 1, r.probabilities[0] > 0.5)
    assert r.report["windows"] >= 1
