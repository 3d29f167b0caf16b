"""Papermill sees every parameter of the theory chapters (issue 9, item 11), and the chapters validate them."""
import ast
import json
from pathlib import Path

import pytest

NBS = Path(__file__).resolve().parents[1] / "nbs"
CHAPTERS = {
    "11_kernel": {"checkpoint", "train_steps", "seed"},
    "12_asymmetry": {"checkpoint", "train_steps", "seed"},
    "13_capacity": {"T", "D", "steps", "seeds"},
    "14_approximation": {"T", "D", "L_max", "C", "rho", "fit_steps", "classifier_steps", "checkpoint"},
}


def _cells(name):
    return json.loads((NBS / f"{name}.ipynb").read_text())["cells"]


def _parameters_index(cells):
    return next(i for i, c in enumerate(cells) if "parameters" in c.get("metadata", {}).get("tags", []))


@pytest.mark.parametrize("name", sorted(CHAPTERS))
def test_papermill_lists_every_parameter(name):
    papermill = pytest.importorskip("papermill")
    listed = set(papermill.inspect_notebook(str(NBS / f"{name}.ipynb")))
    cells = _cells(name)
    assigned = {t.id for node in ast.parse("".join(cells[_parameters_index(cells)]["source"])).body
                for t in node.targets}
    assert listed == assigned == CHAPTERS[name]


@pytest.mark.parametrize("name", sorted(CHAPTERS))
def test_parameters_are_validated_right_after(name):
    cells = _cells(name)
    i = _parameters_index(cells)
    params, check = "".join(cells[i]["source"]), "".join(cells[i + 1]["source"])
    assert "raise" in check
    namespace = {}
    exec(params, namespace)
    exec(check, namespace)  # the defaults pass
    for key, value in namespace.items():
        if key in CHAPTERS[name] and isinstance(value, (int, list)) and not isinstance(value, bool):
            bad = dict(namespace, **{key: "[0, 1]"})  # what papermill -p injects for a list
            with pytest.raises((TypeError, ValueError)):
                exec(check, bad)
