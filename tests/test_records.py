"""Tests of hkt_nb.lra.records: records hold no machine paths, store the library and results versions, and the
learned internals the variant registry reports."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import hkt_nb
from hkt_nb.lra.config import RESULTS_VERSION
from hkt_nb.lra.loop import train
from hkt_nb.lra.records import hkt_internals, save_predictions
from hkt_nb.model import ClassifierConfig, HKTClassifier

QUIET = dict(device="cpu", progress=False, verbose=False)


def test_records_hold_no_absolute_paths(tmp_path):
    record = train("synthetic", results_dir=tmp_path / "r", **QUIET, train_overrides={"save_model": True})
    stored = json.loads((tmp_path / "r" / f"{record['run']}.json").read_text())
    for key in ("checkpoint_dir", "model_path", "predictions_path"):
        assert not Path(stored[key]).is_absolute() and str(tmp_path) not in stored[key]



def test_records_store_the_library_and_results_versions(tmp_path):
    record = train("synthetic", epochs=1, results_dir=tmp_path, **QUIET)
    stored = json.loads((tmp_path / f"{record['run']}.json").read_text())
    assert stored["results_version"] == RESULTS_VERSION and stored["library_version"] == hkt_nb.__version__


def test_internals_come_from_the_variant_registry(temporary_variant):
    "hkt_internals asks the model's variant: HKT reports lambda and g, MHA nothing, a new variant what it declares."
    hkt = HKTClassifier(ClassifierConfig(vocab_size=8, n_classes=2, max_len=16, d_model=16, n_heads=2, n_layers=2))
    internals = hkt_internals(hkt)
    assert set(internals) == {"lambdas", "gates"} and len(internals["lambdas"]) == 2
    torch.testing.assert_close(torch.tensor(internals["lambdas"][1]), hkt.blocks[1].attn.lambdas.detach())
    mha = HKTClassifier(ClassifierConfig(vocab_size=8, n_classes=2, max_len=16, d_model=16, n_heads=2, attention="mha"))
    assert hkt_internals(mha) == {}
    temporary_variant("mha_scaled", internals=lambda layer: {"scale": torch.tensor([2.0])})
    scaled = HKTClassifier(ClassifierConfig(vocab_size=8, n_classes=2, max_len=16, d_model=16, n_heads=2, n_layers=3,
                                            attention="mha_scaled"))
    assert hkt_internals(scaled) == {"scale": [[2.0]] * 3}


def test_save_predictions_names_a_length_mismatch(tmp_path):
    with pytest.raises(ValueError, match="predictions"):
        save_predictions(tmp_path / "p.npz", np.zeros(3), np.zeros(4))
    save_predictions(tmp_path / "p.npz", np.array([1, 2]), np.array([1, 0]))
    assert np.load(tmp_path / "p.npz")["predictions"].tolist() == [1, 2]
