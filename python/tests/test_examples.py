"""The examples run as written: the Dask script on a folder holding the shipped sample twice
(two local workers), the MONAI-style pipeline on the sample; both give the CLI's labels."""
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import DEEPBRAIN, REPO, SAMPLE

EXAMPLES = REPO / "examples" / "python"


def test_dask_folder_two_workers(tmp_path, cli_labels):
    pytest.importorskip("dask.distributed")
    nib = pytest.importorskip("nibabel")
    cases = tmp_path / "in"
    cases.mkdir()
    for name in ("case_a.nii.gz", "case_b.nii.gz"):
        shutil.copy(SAMPLE, cases / name)
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, str(EXAMPLES / "dask_folder.py"), str(cases), str(out), "-m",
         str(DEEPBRAIN), "--workers", "2", "--device", "cpu", "--memory-budget", "2GiB"],
        capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    for name in ("case_a.nii.gz", "case_b.nii.gz"):
        assert name in run.stdout
        assert np.array_equal(np.asarray(nib.load(out / name).dataobj), cli_labels)
    # A second run finds every case done.
    again = subprocess.run([sys.executable, str(EXAMPLES / "dask_folder.py"), str(cases),
                            str(out), "-m", str(DEEPBRAIN)], capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 0 and "nothing to do" in again.stdout


def test_monai_style_pipeline(tmp_path, cli_labels):
    nib = pytest.importorskip("nibabel")
    out = tmp_path / "seg.nii.gz"
    run = subprocess.run([sys.executable, str(EXAMPLES / "monai_pipeline.py"), str(SAMPLE),
                          str(DEEPBRAIN), str(out), "--device", "cpu"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert np.array_equal(np.asarray(nib.load(out).dataobj), cli_labels)
