"""Write the README's results table and its two sentences on what is not established, computed from results/ (chapter 9).

    python scripts/update_readme_results.py          # rewrite the block between the markers
    python scripts/update_readme_results.py --check  # exit 1 when the README's block differs (tests run this check)

The block is `hkt_nb.lra.headline.headline_markdown` and `not_established` of `headline_rows(results/)` (the
classifiers' records and the language model's in results/lm), the table the book's first page and chapter 9 open
with; run this after committing new run records or baselines.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # this checkout's hkt_nb, not another installed copy
    sys.path.insert(0, str(ROOT))

START = "<!-- established: written by scripts/update_readme_results.py from results/; do not edit by hand -->"
END = "<!-- /established -->"
BLOCK = re.compile(re.escape(START) + r"\n(.*?)\n" + re.escape(END), re.S)


def readme_sentences(readme: str) -> str:
    "The generated block between the markers of `readme` (the table and its sentences); ValueError without markers."
    found = BLOCK.search(readme)
    if not found:
        raise ValueError(f"README.md has no block between {START!r} and {END!r}")
    return found.group(1)


def main() -> int:
    from hkt_nb.lra.headline import headline_markdown, headline_rows, not_established

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="only compare; exit 1 when the README is stale")
    a = p.parse_args()
    path = ROOT / "README.md"
    readme = path.read_text()
    rows = headline_rows(ROOT / "results")
    wanted = headline_markdown(rows) + "\n\n" + not_established(rows)
    current = readme_sentences(readme)
    if a.check:
        if current != wanted:
            print(f"README.md is stale; run python scripts/update_readme_results.py\nit says:\n{current}\n"
                  f"results/ says:\n{wanted}")
            return 1
        return 0
    if current != wanted:
        path.write_text(BLOCK.sub(lambda _: f"{START}\n{wanted}\n{END}", readme))
        print("README.md updated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
