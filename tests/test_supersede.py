"""scripts/migrations/supersede_runs.py: the runs of a preset whose size changed are kept under their variant names."""
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("supersede_runs", REPO / "scripts" / "migrations" / "supersede_runs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_run_of_an_old_size_moves_to_its_variant_name(tmp_path):
    from hkt_nb.lra.config import conforms_to_preset, run_variant

    found = sorted((REPO / "results").glob("listops-mha-cpu-*seed1.json"))
    if not found:
        pytest.skip("no committed ListOps cpu record")
    record = json.loads(found[0].read_text())  # as a run of the preset, of a size the preset no longer has
    record.update(run="listops-mha-cpu-seed1", variant=None, overrides={}, predictions_path="predictions/listops-mha-cpu-seed1.npz")
    record["config"]["train"]["n_train"] = 12_345
    template = tmp_path / "listops-mha-cpu-seed1.json"
    template.write_text(json.dumps(record))
    (tmp_path / "predictions").mkdir()
    np.savez(tmp_path / record["predictions_path"], predictions=np.zeros(3, int), labels=np.zeros(3, int))
    runner = _script()
    assert runner.superseded(tmp_path, "cpu", "listops") == [tmp_path / template.name]
    runner.main(["--preset", "cpu", "--task", "listops", "--results-dir", str(tmp_path)])
    variant = run_variant({"train": {"n_train": 12_345}})
    name = f"listops-mha-cpu-{variant}-seed1"
    moved = json.loads((tmp_path / f"{name}.json").read_text())
    assert not (tmp_path / template.name).exists() and (tmp_path / "predictions" / f"{name}.npz").is_file()
    assert moved["run"] == name and moved["variant"] == variant and moved["overrides"] == {"train": {"n_train": 12_345}}
    assert moved["predictions_path"] == f"predictions/{name}.npz" and moved["test_acc"] == record["test_acc"]
    assert json.loads((tmp_path / "variants.json").read_text()) == {"runs": [name]}  # the index chapters fetch variants by
    assert not conforms_to_preset(moved, "cpu") and runner.superseded(tmp_path, "cpu", "listops") == []
