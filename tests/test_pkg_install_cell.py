"""The one install cell (scripts/install_cell.py): every chapter carries the same generated cell, pinned to the
book's version and repository address, and the cell does nothing where the library is installed."""
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]


def install_cells():
    for path in sorted((ROOT / "nbs").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        cells = [c.source for c in nb.cells if c.cell_type == "code" and "# Installs hkt_nb" in c.source]
        yield path.name, nb, cells


def test_every_chapter_cell_is_the_generated_one():
    result = subprocess.run([sys.executable, "scripts/install_cell.py", "--check"], cwd=ROOT, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name, nb, cells", list(install_cells()), ids=lambda v: v if isinstance(v, str) else "")
def test_cell_pins_version_and_address(name, nb, cells, settings):
    imports = any("hkt_nb" in c.source and ("import hkt_nb" in c.source or "from hkt_nb" in c.source)
                  for c in nb.cells if c.cell_type == "code")
    assert len(cells) == (1 if imports else 0), f"{name}: {len(cells)} install cells"
    if cells:
        cfg = settings
        assert f"git+{cfg['git_url']}@v{cfg['version']}" in cells[0]
        assert "HKT_NB_SOURCE" in cells[0]
        if "hkt_nb.lra" in "\n".join(c.source for c in nb.cells):
            assert "hkt_nb[lra" in cells[0] and "'datasets'" in cells[0]


def test_cell_installs_nothing_where_the_library_is_installed(monkeypatch):
    "Executed in this environment (hkt_nb and its extras importable), the cell never calls pip."
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: calls.append(a))
    for name, _, cells in install_cells():
        for source in cells:
            exec(source.replace("#| hide", ""), {})
    assert calls == []
