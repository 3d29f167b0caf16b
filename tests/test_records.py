"""Tests of hkt_nb.train.records: records hold no machine paths, store the library and results versions, and the
learned internals the variant registry reports."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import hkt_nb
from hkt_nb.lra.config import RESULTS_VERSION
from hkt_nb.lra.loop import train
from hkt_nb.train.records import (
    UnreadableRecordError,
    hkt_internals,
    read_predictions,
    read_record,
    save_predictions,
)
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


# ---------------------------------------------------------------- the one safe reader (issue 20, item 2)
GOOD_RECORD = {"run": "listops-hkt-cpu-seed0", "complete": True, "task": "listops", "model": "hkt", "preset": "cpu",
               "seed": 0, "test_acc": 0.5}


@pytest.mark.parametrize("content, problem", [
    ('{"run": "listops-hkt-cpu-seed0", "complete": tr', "truncated or not JSON"),  # a copy cut short
    ("", "empty"),
    ("[1, 2, 3]", "a JSON list, not a run record"),
    ('"a string"', "a JSON str, not a run record"),
    (json.dumps({k: v for k, v in GOOD_RECORD.items() if k != "task"}), r"missing the key\(s\) \['task'\]"),
    (json.dumps({k: v for k, v in GOOD_RECORD.items() if k != "test_acc"}), r"missing the key\(s\) \['test_acc'\]"),
])
def test_read_record_names_the_file_and_the_problem(tmp_path, content, problem):
    path = tmp_path / "listops-hkt-cpu-seed0.json"
    path.write_text(content)
    with pytest.raises(UnreadableRecordError, match=f"unreadable record {path}: {problem}"):
        read_record(path)


def test_read_record_reads_good_records_and_bytes_that_are_not_text(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(GOOD_RECORD))
    assert read_record(path) == GOOD_RECORD
    incomplete = {k: v for k, v in GOOD_RECORD.items() if k != "test_acc"} | {"complete": False}
    path.write_text(json.dumps(incomplete))
    assert read_record(path) == incomplete  # no test result needed before the run is complete
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(UnreadableRecordError, match=f"unreadable record {path}: UnicodeDecodeError"):
        read_record(path)
    with pytest.raises(FileNotFoundError):
        read_record(tmp_path / "missing.json")
    assert issubclass(UnreadableRecordError, ValueError)


def test_read_predictions_round_trip_and_every_kind_of_damage(tmp_path):
    path = tmp_path / "p.npz"
    save_predictions(path, np.array([3, 1, 2]), np.array([3, 0, 2]))
    predictions, labels = read_predictions(path, n_expected=3)
    assert predictions.tolist() == [3, 1, 2] and labels.tolist() == [3, 0, 2] and predictions.dtype == np.int64
    cases = {
        "truncated": (lambda: path.write_bytes(path.read_bytes()[:40]), "damaged or not a .npz"),
        "text": (lambda: path.write_text("not an npz"), "damaged or not a .npz"),
        "no labels": (lambda: np.savez(path, predictions=np.array([1])), r"no array \['labels'\]"),
        "empty": (lambda: np.savez(path, predictions=np.zeros(0, int), labels=np.zeros(0, int)), "non-zero length"),
        "shapes": (lambda: np.savez(path, predictions=np.array([1, 2]), labels=np.array([1])), "one non-zero length"),
        "floats": (lambda: np.savez(path, predictions=np.array([0.5]), labels=np.array([1])), "integer classes"),
    }
    for name, (damage, problem) in cases.items():
        damage()
        with pytest.raises(UnreadableRecordError, match=f"unreadable predictions {path}: .*{problem}"):
            read_predictions(path)
    save_predictions(path, np.array([1, 2]), np.array([1, 2]))
    with pytest.raises(UnreadableRecordError, match="2 examples, but the record says 3"):
        read_predictions(path, n_expected=3)
    with pytest.raises(FileNotFoundError, match="missing.npz"):
        read_predictions(tmp_path / "missing.npz")


def test_the_best_model_is_saved_as_safetensors_beside_its_pt_file(smoke_run):
    "A run with save_model writes `pretrained/<run>/`, which loads to the same weights and logits as the `.pt` file."
    from hkt_nb.model import HKTClassifier
    folder, record = smoke_run
    results = folder / "results"
    assert record["pretrained_path"] == f"pretrained/{record['run']}"
    pretrained = HKTClassifier.from_pretrained(results / record["pretrained_path"])
    checkpoint = HKTClassifier.from_checkpoint(results / record["model_path"])
    assert pretrained.state_dict().keys() == checkpoint.state_dict().keys()
    assert all(torch.equal(v, checkpoint.state_dict()[k]) for k, v in pretrained.state_dict().items())
    ids = torch.randint(1, pretrained.cfg.vocab_size, (2, 16))
    assert torch.equal(pretrained(ids), checkpoint(ids))
    assert f"{record['test_acc']:.4f}"[:4] in (results / record["pretrained_path"] / "README.md").read_text()
