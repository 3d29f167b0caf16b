"""Build the HTML book from the chapters in nbs/.

1. Copy every chapter listed in _toc.yml to _build/book_src/ (same relative paths), mapping nbdev
   directives to Jupyter Book cell tags and removing the `#|` lines, so the book never shows them.
2. Execute each copy with papermill (working directory nbs/, like nbdev_test). A failing cell stops
   the build with an error: no chapter is published without its outputs.
   Experiment chapters (EXPERIMENTS below) are not retrained here: the build
   takes the executed copy that `make chapters PRESET=...` wrote to results/chapters/<preset>/, the
   largest preset available (paper, then cpu, then smoke); with none, it executes them with --preset.
3. Run `jupyter-book build` with warnings as errors; Jupyter Book itself executes nothing.

Usage: python scripts/build_book.py [--preset smoke] [--no-execute] [--keep-going]
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "_build" / "book_src"
PRESETS_BY_PRIORITY = ("paper", "cpu", "smoke")

# nbdev directive -> Jupyter Book tag (None: keep the cell as is, just drop the directive line)
DIRECTIVE_TAGS = {
    "hide": "remove-cell",
    "default_exp": "remove-cell",
    "exporti": "remove-cell",
    "export": None,
    "exports": None,
    "echo: false": "remove-input",
    "output: false": "remove-output",
    "eval: false": "skip-execution",
    "notest": None,
    "slow": None,
}
DIRECTIVE = re.compile(r"^#\|\s*(.*?)\s*$")


def toc_files(toc_path: Path) -> list[str]:
    "All `file:` entries of a Jupyter Book 1 _toc.yml, root first."
    toc = yaml.safe_load(toc_path.read_text())
    files = [toc["root"]]

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                files.append(node["file"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk({k: v for k, v in toc.items() if k != "root"})
    return files


def directive_tag(directive: str) -> str | None:
    for key, tag in DIRECTIVE_TAGS.items():
        if directive == key or directive.startswith(key + " ") or directive.replace(" ", "") == key.replace(" ", ""):
            return tag
    raise ValueError(f"unknown nbdev directive '#| {directive}': add it to DIRECTIVE_TAGS in {__file__}")


def translate(nb):
    "Map `#|` directives of code cells to tags and strip them from the source (in place)."
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        lines, tags = cell.source.splitlines(), list(cell.metadata.get("tags", []))
        kept = []
        for line in lines:
            m = DIRECTIVE.match(line)
            if m:
                tag = directive_tag(m.group(1))
                if tag and tag not in tags:
                    tags.append(tag)
            else:
                kept.append(line)
        cell.source = "\n".join(kept).strip("\n")
        if tags:
            cell.metadata["tags"] = tags
    return nb


# The training chapters (the Makefile's EXPERIMENTS): executed by `make chapters PRESET=...`, never retrained here.
EXPERIMENTS = ("06_listops", "07_scifar10", "08_imdb")


def executed_copy(name: str) -> Path | None:
    for preset in PRESETS_BY_PRIORITY:
        p = ROOT / "results" / "chapters" / preset / f"{name}.ipynb"
        if p.exists():
            return p
    return None


def execute(path: Path, parameters: dict | None = None):
    import papermill as pm

    # figures must be displayed inline: MPLBACKEND=Agg (handy for tests) would silently drop every figure
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"

    t0 = time.time()
    pm.execute_notebook(str(path), str(path), parameters=parameters or {}, cwd=str(ROOT / "nbs"),
                        kernel_name="python3", language="python", progress_bar=False, log_output=False)
    print(f"  executed {path.relative_to(ROOT)} in {time.time() - t0:.1f} s", flush=True)


def check_figures(path: Path):
    "A chapter that plots must show its figures: fail if it draws (plt./sns.) but has no image output."
    nb = nbformat.read(path, as_version=4)
    plots = any(("plt." in c.source or "sns." in c.source) for c in nb.cells if c.cell_type == "code")
    images = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    if plots and not images:
        sys.exit(f"{path.relative_to(ROOT)} draws figures but has no image output (matplotlib backend?)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="smoke", help="preset for experiment chapters with no executed copy")
    ap.add_argument("--no-execute", action="store_true", help="only prepare the sources (for debugging)")
    args = ap.parse_args(argv)

    if SRC.exists():
        shutil.rmtree(SRC)
    SRC.mkdir(parents=True)
    for f in ("_config.yml", "_toc.yml", "references.bib"):
        shutil.copy(ROOT / f, SRC / f)
    for name in toc_files(ROOT / "_toc.yml"):
        src = ROOT / f"{name}.ipynb"
        if not src.exists():
            sys.exit(f"_toc.yml lists {name}, but {src} does not exist")
        dest = SRC / f"{name}.ipynb"
        dest.parent.mkdir(parents=True, exist_ok=True)
        nb = nbformat.read(src, as_version=4)
        if Path(name).name in EXPERIMENTS:
            done = executed_copy(Path(name).name)
            if done is not None:
                print(f"  {name}: using executed copy {done.relative_to(ROOT)}", flush=True)
                nbformat.write(translate(nbformat.read(done, as_version=4)), dest)
                continue
            nbformat.write(translate(nb), dest)
            if not args.no_execute:
                execute(dest, {"preset": args.preset})
            continue
        nbformat.write(translate(nb), dest)
        if not args.no_execute:
            execute(dest)
    if args.no_execute:
        return
    for name in toc_files(ROOT / "_toc.yml"):
        check_figures(SRC / f"{name}.ipynb")
    cmd = [str(Path(sys.executable).parent / "jupyter-book"), "build", str(SRC), "--path-output", str(ROOT / "_build"), "-W", "-n", "--keep-going"]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)
    print(f"\nThe book is at {ROOT / '_build' / '_build' / 'html' / 'index.html'}")


if __name__ == "__main__":
    main()
