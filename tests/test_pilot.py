"""The pilot of chapter 5g: a candidate that is the `cpu` preset's own setting reads the grid's seed-0 run."""
import json

from hkt_nb.lra.config import run_name
from hkt_nb.lra.pilot import PILOT_CANDIDATES, choose_candidates, grid_candidate, load_pilot


def _record(acc, loss, complete=True):
    return {"run": "r", "complete": complete, "test_acc": acc,
            "history": [{"epoch": 1, "val_acc": acc, "val_loss": loss, "train_time_s": 1.0}]}


def _write(path, body):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body))


def test_grid_candidates_are_the_cpu_sizes():
    assert [c for c in PILOT_CANDIDATES if grid_candidate(c)] == ["listops-short-200k", "scifar10-45k", "imdb-45k"]
    assert not grid_candidate("scifar10-45k", "cpu_small")


def test_a_grid_candidate_reads_the_grid_run_and_the_cpu_baselines(tmp_path):
    for model, acc in (("hkt", 0.42), ("mha", 0.40)):
        _write(tmp_path / f"{run_name('scifar10', model, 'cpu', 0)}.json", _record(acc, 1.6))
    _write(tmp_path / "baselines" / "scifar10-cpu.json",
           {"strongest": "pixels", "baselines": {"pixels": {"val_acc": 0.30, "test_acc": 0.28}}})
    records, baselines = load_pilot(tmp_path)
    assert set(records) == {("scifar10-45k", "hkt"), ("scifar10-45k", "mha")} and set(baselines) == {"scifar10-45k"}
    assert records["scifar10-45k", "hkt"]["pilot"]["source"].startswith("the `cpu` grid's run")
    assert choose_candidates(records, baselines)["scifar10"] == "scifar10-45k"  # +12 and +10 points over pixels
    # the pilot's own file wins over the grid's run
    _write(tmp_path / "pilot" / "scifar10-45k-mha.json", _record(0.31, 2.0))
    records, _ = load_pilot(tmp_path)
    assert records["scifar10-45k", "mha"]["test_acc"] == 0.31 and "source" not in records["scifar10-45k", "mha"]
    assert choose_candidates(records, baselines)["scifar10"] is None  # mha +1 point: below the margin


def test_an_unfinished_grid_run_is_not_a_pilot_run(tmp_path):
    _write(tmp_path / f"{run_name('imdb', 'hkt', 'cpu', 0)}.json", _record(0.8, 0.4, complete=False))
    assert load_pilot(tmp_path) == ({}, {})
    assert not grid_candidate("imdb-20k")  # 10,000 examples twice: not the preset's 22,500
