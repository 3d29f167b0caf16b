"""Hide the code that only reshapes tables on the results, cost and experiment pages (issue 13, item 5).

A code cell of the experiment chapters (the task registry's) and chapters 09-10 gets the Jupyter Book tag `hide-input` (the code stays one click away, the
table shows) when it builds or formats a table (pandas `DataFrame`/`groupby`/`unstack`/`pivot`/`agg`, or
a hand-formatted text table) and does not teach: cells that export library code, carry `parameters`, assert
(example-tests), or are already hidden by a directive or a tag are left alone. Rule-based, so it still
applies after the chapters are rewritten.

Usage (from the repository root, then `nbdev_clean`):
    python scripts/tag_cells.py            # list what it would tag (exit 1 if anything is left untagged)
    python scripts/tag_cells.py --write    # tag those cells in place
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # this checkout's hkt_nb, not another installed copy
    sys.path.insert(0, str(ROOT))
RESULT_CHAPTERS = ("09_results", "10_cost")  # beside the experiment chapters, which the task registry lists


def chapters() -> tuple[str, ...]:
    "The chapters whose table code is hidden: every experiment chapter of the task registry, then the results ones."
    from hkt_nb.lra.tasks import chapters as experiment_chapters

    return (*experiment_chapters(), *RESULT_CHAPTERS)
TABLE = re.compile(r"pd\.DataFrame\(|\.groupby\(|\.unstack\(|\.pivot(_table)?\(|\.agg\(|\.to_markdown\(|"
                   r"\.style\b|^def table\(|print\(f\"\{'[^']*':>\d+\}", re.M)
TEACHES = re.compile(r"^\s*assert\b|^\s*#\|\s*export", re.M)
HIDDEN_BY_DIRECTIVE = re.compile(r"^\s*#\s*\|\s*(hide|echo:\s*false|include:\s*false|code-fold)", re.M)
HIDING_TAGS = {"parameters", "hide-input", "remove-input", "remove-cell", "hide-cell"}


def reshapes_a_table(cell) -> bool:
    "True when the cell only builds or formats a table (see the module docstring)."
    if cell.cell_type != "code" or HIDING_TAGS & set(cell.metadata.get("tags", [])):
        return False
    source = cell.source
    if TEACHES.search(source) or HIDDEN_BY_DIRECTIVE.search(source) or "plt." in source:
        return False
    return bool(TABLE.search(source))


def tag_chapter(path: Path, write: bool) -> list[str]:
    notebook = nbformat.read(path, as_version=4)
    tagged = []
    for index, cell in enumerate(notebook.cells):
        if reshapes_a_table(cell):
            first_line = cell.source.strip().splitlines()[0][:70]
            tagged.append(f"{path.name} cell {index}: hide-input  ({first_line})")
            cell.metadata["tags"] = list(cell.metadata.get("tags", [])) + ["hide-input"]
    if write and tagged:
        nbformat.write(notebook, path)
    return tagged


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="tag the cells in place (then run nbdev_clean)")
    args = parser.parse_args(argv)
    found = []
    for name in chapters():
        path = ROOT / "nbs" / f"{name}.ipynb"
        if path.exists():
            found += tag_chapter(path, args.write)
    print("\n".join(found) if found else "no table-reshaping cell left untagged")
    return 0 if args.write or not found else 1


if __name__ == "__main__":
    sys.exit(main())
