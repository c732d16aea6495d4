"""Paths the tests share: the shipped sample (data/), the shared fixtures (../shared, or
VOXTILE_SHARED_DIR) and the voxtile binary the labels are compared with (VOXTILE_BIN, else the
cargo target dir's debug build). CI sets VOXTILE_REQUIRE_FIXTURES=1: a missing one fails there
instead of skipping, as in the Rust tests."""
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "data"
SAMPLE, DEEPBRAIN = DATA / "head_t1_128.nii.gz", DATA / "deepbrain.onnx"


def _need(path: Path) -> Path:
    if path.exists():
        return path
    if os.environ.get("VOXTILE_REQUIRE_FIXTURES"):
        pytest.fail(f"{path} is missing and VOXTILE_REQUIRE_FIXTURES is set")
    pytest.skip(f"{path} not found")


@pytest.fixture(scope="session")
def shared() -> Path:
    root = os.environ.get("VOXTILE_SHARED_DIR") or REPO.parent / "shared"
    return _need(Path(root) / "fixtures")


@pytest.fixture(scope="session")
def voxtile_bin() -> Path:
    exe = os.environ.get("VOXTILE_BIN")
    if exe is None:
        target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
        exe = target / "debug" / "voxtile"
    return _need(Path(exe))


@pytest.fixture(scope="session")
def sample():
    """The shipped sample as a pipeline reads it: float32 array (i, j, k) and its affine."""
    nib = pytest.importorskip("nibabel")
    img = nib.load(SAMPLE)
    return np.asarray(img.dataobj, dtype=np.float32), img.affine


@pytest.fixture(scope="session")
def cli_labels(voxtile_bin, tmp_path_factory):
    """What `voxtile segment head_t1_128.nii.gz -m deepbrain.onnx --device cpu` writes."""
    nib = pytest.importorskip("nibabel")
    out = tmp_path_factory.mktemp("cli") / "cli.nii.gz"
    subprocess.run([str(voxtile_bin), "segment", str(SAMPLE), "-m", str(DEEPBRAIN), "-o", str(out),
                    "--device", "cpu", "-q"], check=True)
    return np.asarray(nib.load(out).dataobj)


@pytest.fixture(scope="session")
def deepbrain():
    import voxtile
    return voxtile.Model(DEEPBRAIN, device="cpu")
