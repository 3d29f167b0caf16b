"""scripts/gpu_results.py, the accuracy step of a lent GPU (issue 32): its plan and its checks, without a GPU. The whole
path (prepare, probe, plan, train, records with predictions) runs on the CPU at toy size in `make gpu-check-dry`."""
import importlib.util
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gpu_results():
    spec = importlib.util.spec_from_file_location("gpu_results", REPO / "scripts" / "gpu_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_plan_fits_whole_epochs_into_the_budget(gpu_results):
    plan = gpu_results.plan_epochs
    # 1,000 examples/s for 150 s = 150,000 examples: one whole epoch of 96,000 fits, two do not
    assert plan(1000.0, 150.0, 96_000, 10) == {"epochs": 1, "fits": True}
    assert plan(3200.0, 150.0, 96_000, 10) == {"epochs": 5, "fits": True}  # 480,000 examples: exactly 5 epochs
    assert plan(1e6, 150.0, 96_000, 10) == {"epochs": 10, "fits": True}  # never more than the preset's epochs
    assert plan(100.0, 150.0, 96_000, 10) == {"epochs": 1, "fits": False}  # not one epoch: one, marked as not fitting
    for bad in ((0.0, 150.0, 96_000, 10), (1000.0, -1.0, 96_000, 10), (1000.0, 150.0, 0, 10), (1000.0, 150.0, 96_000, 0)):
        with pytest.raises(ValueError, match="positive throughput"):
            plan(*bad)


def test_defaults_state_the_budget_and_places(gpu_results):
    real, dry = gpu_results.parse_args(["train"]), gpu_results.parse_args(["dry-run"])
    assert real.budget == 150.0 and real.device == "cuda" and real.out == REPO / "results" / "gpu" / "accuracy"
    assert real.data == REPO / "_build" / "gpu_carry" / "listops-paper.tar.gz"  # the one file a device call carries
    assert dry.device == "cpu" and dry.out.is_relative_to(REPO / "_build") and dry.data.is_relative_to(REPO / "_build")
    assert gpu_results.FULL == {"n_train": 96_000, "n_val": 2_000, "n_test": 10_000}  # the "paper" ListOps setting


def test_unpack_refuses_a_missing_archive_and_gives_back_what_was_packed(gpu_results, tmp_path):
    with pytest.raises(SystemExit, match="gpu_results.py prepare"):
        gpu_results.unpack(tmp_path / "listops-paper.tar.gz")
    (tmp_path / "src" / "tokenized").mkdir(parents=True)
    (tmp_path / "src" / "tokenized" / "a.arrow").write_bytes(b"123")
    (tmp_path / "src" / "prepared.json").write_text("{}")
    archive = tmp_path / "listops-paper.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "src" / "tokenized", arcname="tokenized")
        tar.add(tmp_path / "src" / "prepared.json", arcname="prepared.json")
    folder = gpu_results.unpack(archive)
    assert folder == tmp_path / "listops-paper-unpacked"
    assert gpu_results.cache_listing(folder) == {"prepared.json": 2, "tokenized/a.arrow": 3}
