"""plan and info as dicts, the docstrings and stubs that ship."""
import importlib.resources
import pydoc

import pytest

import voxtile
from conftest import DEEPBRAIN


def test_plan_of_a_path_and_of_a_model(deepbrain):
    p = voxtile.plan(DEEPBRAIN, (128, 128, 128), memory_budget="1GiB", device="cpu")
    assert p["budget"] == 1 << 30 and p["budget_source"] == "--memory-budget"
    assert p["batch"] >= 1 and p["roi"] == [128, 128, 128] and p["volume"] == [128, 128, 128]
    q = voxtile.plan(deepbrain, (128, 128, 128))
    assert q["budget"] == deepbrain.info["memory_budget"]["bytes"]
    assert q["estimate"] == voxtile.plan(DEEPBRAIN, (128, 128, 128), device="cpu",
                                         memory_budget=q["budget"])["estimate"]
    with pytest.raises(voxtile.InvalidInput):
        voxtile.plan(deepbrain, (128, 128, 128), memory_budget="1GiB")
    with pytest.raises(voxtile.BudgetTooSmall):
        voxtile.plan(DEEPBRAIN, (128, 128, 128), memory_budget="1MiB", device="cpu")


def test_info(deepbrain):
    info = deepbrain.info
    assert info["input"]["channels"] == 1 and info["output"]["channels"] == 1
    assert len(info["receptive_field"]) == 3 and info["device"].startswith("cpu")
    assert info["manifest"] is None


def test_help_reads_like_the_readme():
    text = pydoc.render_doc(voxtile.Model, renderer=pydoc.plaintext)
    for words in ("memory_budget", "segment(", "affine", "bitwise", "tqdm"):
        assert words in text, words
    assert "segment_file" in pydoc.render_doc(voxtile, renderer=pydoc.plaintext)


def test_stubs_ship():
    files = importlib.resources.files("voxtile")
    assert files.joinpath("__init__.pyi").is_file() and files.joinpath("py.typed").is_file()
