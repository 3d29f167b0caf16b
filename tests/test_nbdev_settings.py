"""nbdev_clean must keep what papermill, Jupyter Book and Colab read (settings.ini allowed_*_keys)."""
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]


def test_nbdev_clean_keeps_tags_and_notebook_metadata(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.metadata.update({"accelerator": "GPU", "colab": {"gpuType": "T4", "provenance": []},
                        "mystnb": {"execution_mode": "off"}})
    cell = nbformat.v4.new_code_cell("preset = 'smoke'", metadata={"tags": ["parameters"], "scrolled": True})
    nb.cells = [cell, nbformat.v4.new_code_cell("1", metadata={"tags": ["remove-cell"]})]
    path = tmp_path / "probe.ipynb"
    nbformat.write(nb, path)
    nbdev_clean = Path(sys.executable).parent / "nbdev_clean"
    subprocess.run([str(nbdev_clean), "--fname", str(path)], check=True, cwd=ROOT)
    cleaned = nbformat.read(path, as_version=4)
    assert cleaned.metadata["accelerator"] == "GPU" and cleaned.metadata["colab"]["gpuType"] == "T4"
    assert cleaned.metadata["mystnb"] == {"execution_mode": "off"}
    assert cleaned.cells[0].metadata == {"tags": ["parameters"]}
    assert cleaned.cells[1].metadata == {"tags": ["remove-cell"]}
