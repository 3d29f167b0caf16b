"""Write the one install cell into every chapter that imports the library, from one template.

    python scripts/install_cell.py           # rewrite the cells
    python scripts/install_cell.py --check   # exit 1 when a chapter's cell differs (make check-sync runs this)

The cell installs hkt_nb at the book's version (`version` of settings.ini, as the tag `v<version>`) from the
repository address (`git_url` of settings.ini), with the extras the chapter imports (`lra`, `theory`), and only
when an import fails, so it does nothing in a clone or wherever the library is already installed. The
environment variable HKT_NB_SOURCE replaces the source (a local clone as `file:///path/to/hkt_nb`, a wheel, another
tag), for machines that cannot reach the repository host.
"""
from __future__ import annotations

import argparse
import configparser
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
MARK = "# Installs hkt_nb"
# modules that an extra brings, checked before installing (the core needs only torch and numpy)
EXTRA_MODULES = {"lra": ("datasets", "PIL"), "theory": (), "plot": ("matplotlib", "seaborn", "pandas")}
PLOT_IMPORT = r"^\s*(import|from) (matplotlib|seaborn|pandas)\b"

TEMPLATE = '''#| hide
# Installs hkt_nb (this book's version) where it is missing, e.g. on Colab; does nothing where it is installed.
# Written by scripts/install_cell.py from settings.ini. HKT_NB_SOURCE overrides the source (file:///path/to/clone).
import importlib.util, os, subprocess, sys
if any(importlib.util.find_spec(m) is None for m in {modules!r}):
    source = os.environ.get("HKT_NB_SOURCE", "{source}")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", f"hkt_nb{extras} @ {{source}}"], check=True)'''


def settings() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(delimiters=["="])
    parser.read(ROOT / "settings.ini", encoding="utf-8")
    return parser["DEFAULT"]


def extras_of(nb) -> list[str]:
    """The extras a chapter needs: the subpackages (hkt_nb.lra, hkt_nb.theory) its code imports, `lra` also for
    hkt_nb.lm (it reads IMDB and trains with that extra's tools), and `plot` if it draws."""
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    extras = [extra for extra, pattern in (("lra", r"hkt_nb\.(lra|lm)\b"), ("theory", r"hkt_nb\.theory\b"))
              if re.search(pattern, code)]
    if re.search(PLOT_IMPORT, code, re.M) or ".plot(" in code:  # the chapter draws (itself or through the library)
        extras.append("plot")
    return extras


def cell_source(nb, cfg) -> str:
    "The install cell of this chapter."
    extras = extras_of(nb)
    modules = ("hkt_nb",) + tuple(m for e in extras for m in EXTRA_MODULES[e])
    source = f"git+{cfg['git_url']}@v{cfg['version']}"
    return TEMPLATE.format(modules=modules, source=source, extras=f"[{','.join(extras)}]" if extras else "")


def imports_library(nb) -> bool:
    return any(c.cell_type == "code" and re.search(r"\b(from|import) hkt_nb\b", c.source) for c in nb.cells)


def install_index(nb) -> int | None:
    "Index of the chapter's install cell (ours, or the older pasted one), else None."
    for i, c in enumerate(nb.cells[:5]):
        if c.cell_type == "code" and (MARK in c.source or "pip\", \"install\"" in c.source):
            return i
    return None


def insert_position(nb) -> int:
    "After the title and the `default_exp` cell (the first code cell a reader meets)."
    i = 1 if nb.cells and nb.cells[0].cell_type == "markdown" else 0
    while i < len(nb.cells) and nb.cells[i].cell_type == "code" and "default_exp" in nb.cells[i].source:
        i += 1
    return i


def update(path: Path, cfg, write: bool) -> bool:
    "True when the chapter's cell is (or was) out of date."
    nb = nbformat.read(path, as_version=4)
    index = install_index(nb)
    if not imports_library(nb):  # a chapter that defines what it uses needs no install cell
        if index is not None and write:
            del nb.cells[index]
            nbformat.write(nb, path)
        return index is not None
    want = cell_source(nb, cfg)
    if index is not None and nb.cells[index].source == want:
        return False
    if write:
        if index is None:
            cell = nbformat.v4.new_code_cell(want)
            cell.pop("id", None)
            nb.cells.insert(insert_position(nb), cell)
        else:
            nb.cells[index].source = want
        nbformat.write(nb, path)
    return True


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="only report chapters whose cell differs; exit 1 if any")
    a = p.parse_args(argv)
    cfg = settings()
    stale = [path.name for path in sorted((ROOT / "nbs").glob("*.ipynb")) if update(path, cfg, not a.check)]
    if a.check and stale:
        print("ERROR: install cells differ from scripts/install_cell.py in: " + ", ".join(stale) +
              "; run python scripts/install_cell.py (then nbdev_clean) and commit.")
        return 1
    if stale:
        print("updated the install cell of: " + ", ".join(stale))
    return 0


if __name__ == "__main__":
    sys.exit(main())
