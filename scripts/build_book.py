"""Build the HTML book from the chapters in nbs/.

1. Copy every chapter listed in _toc.yml to _build/book_src/ (same relative paths), reading each code
   cell's nbdev directives with nbdev's own parser (`nbdev.process.extract_directives`, so the book and the
   library always agree on what is a directive: `#| hide`, `# | hide`, `#| hide:`, `  #| echo: false`),
   mapping them to Jupyter Book cell tags and removing them, so the book never shows them.
   The book's _config.yml gets the repository address, branch and site address from settings.ini (the one
   place they are written).
2. Execute each copy with papermill (working directory nbs/, like nbdev_test). A failing cell stops
   the build with an error: no chapter is published without its outputs.
   Experiment chapters (`experiment_chapters()`: the task registry's chapters) are not retrained here: the build
   takes the executed copy that `make chapters PRESET=...` wrote to results/chapters/<preset>/, the
   largest preset available (paper, then cpu, then cpu_small, then smoke); with none, it executes them with --preset.
   Plumbing is hidden from the HTML (tag `remove-cell`; the code stays in the notebook and runs), by rules on the
   cell's source (`plumbing_tag`, `split_export_imports`), so every chapter opens with its idea: the install cell,
   cells of only imports (an `#| export` import block, the `show_doc` fallback, `_all_` lists, display options),
   the leading import block of an `#| export` cell that goes on with code (split off into its own hidden cell),
   and the parameter checks of papermill chapters (a cell that starts `# validate the parameters`). The
   `parameters` cell and the one papermill injects are folded (`hide-cell`: one click away).
3. Run `jupyter-book build` with warnings as errors; Jupyter Book itself executes nothing.
4. Write a redirect page `<name>.html` for every chapter `nbs/NN_<name>.ipynb`: the links nbdev writes into
   hkt_nb/_modidx.py (`<doc_host><doc_baseurl>/<name>.html#<symbol>`) then open the chapter's page.

Usage: python scripts/build_book.py [--preset smoke] [--no-execute] [--pages nbs/00_index nbs/99_references]
       [--reuse-outputs]  (keep the outputs of chapters whose code is unchanged since the last build)
"""
from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import yaml
from nbdev.process import extract_directives, first_code_ln

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # this checkout's hkt_nb, not another installed copy
    sys.path.insert(0, str(ROOT))
SRC = ROOT / "_build" / "book_src"
PRESETS_BY_PRIORITY = ("paper", "cpu", "cpu_small", "smoke")

# nbdev directive -> Jupyter Book tag (None: keep the cell, just drop the directive line). Keys are nbdev's
# directive names (`extract_directives` gives `echo:` for `#| echo: false`; the trailing colon is dropped).
DIRECTIVE_TAGS = {
    "hide": "remove-cell",
    "include: false": "remove-cell",
    "default_exp": "remove-cell",
    "exporti": "remove-cell",
    "export": None,
    "exports": None,
    "echo: false": "remove-input",
    "output: false": "remove-output",
    "eval: false": "skip-execution",
    "code-fold: true": "hide-input",
    "notest": None,
    "slow": None,
}
MAGIC = re.compile(r"^\s*%%\w+")  # a cell magic among the leading lines stays (nbdev keeps it too)
PLUMBING = "remove-cell"  # the tag of plumbing (see `plumbing_tag`)
INSTALL_MARK = "Written by scripts/install_cell.py"  # the install cell's own comment (scripts/install_cell.py)
VALIDATION = re.compile(r"\A\s*# validate the parameters\b")  # the first line of a papermill chapter's parameter checks
EXPORTED_NAMES = {"_all_", "__all__"}  # nbdev's list of a module's public names
DISPLAY_OPTIONS = {"set_option", "filterwarnings", "simplefilter"}  # pd.set_option(...), warnings.filterwarnings(...)
FOLDED = "hide-cell"  # papermill's parameters: one click away
PARAMETER_TAGS = {"parameters", "injected-parameters"}
# progress bars and tool logs are for a person watching a run, not for the printed page: the `datasets` library's
# bars ("Saving the dataset", "Map", "tokenising"), any tqdm bar that does not choose for itself (the library's own
# pass `disable=None`: off where the output is not a terminal, as in a kernel), and the PyTorch profiler's
# "USDT: ... profiler_start" lines on stderr (kineto's log levels run 0-5: 6 silences all of them)
QUIET_PROGRESS = {"TQDM_DISABLE": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1", "KINETO_LOG_LEVEL": "6"}


def is_plumbing_statement(node: ast.stmt) -> bool:
    """An import, an import guarded by `try: ... except ImportError` (whatever the fallback does: the `show_doc`
    stand-in, a clear message for a missing extra, another platform's module), nbdev's `_all_`
    list, or a display option (`pd.set_option(...)`, `warnings.filterwarnings(...)`): what a reader need not see."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return True
    if isinstance(node, ast.Try):
        caught = {getattr(h.type, "id", getattr(h.type, "attr", None)) for h in node.handlers}
        return (bool(node.handlers) and caught <= {"ImportError", "ModuleNotFoundError"} and not node.finalbody
                and all(isinstance(n, (ast.Import, ast.ImportFrom)) for n in node.body + node.orelse))
    if isinstance(node, ast.With):  # `with warnings.catch_warnings(): <filters and imports>`: a quiet import
        quiet = all(getattr(getattr(item.context_expr, "func", None), "attr", None) == "catch_warnings"
                    for item in node.items)
        return quiet and all(is_plumbing_statement(n) for n in node.body)
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return all(isinstance(t, ast.Name) and t.id in EXPORTED_NAMES for t in targets)
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        func = node.value.func
        return getattr(func, "attr", getattr(func, "id", None)) in DISPLAY_OPTIONS
    return False


def parse_cell(source: str) -> list[ast.stmt] | None:
    "The top-level statements of a code cell (None: not plain Python, e.g. a cell magic or `!pip`)."
    try:
        return ast.parse(source).body
    except SyntaxError:
        return None


def plumbing_tag(source: str, tags=()) -> str | None:
    """The tag that keeps a code cell's plumbing out of the HTML, from its source (directives already stripped) and
    its tags: `remove-cell` for the install cell, a cell of only plumbing statements (`is_plumbing_statement`) and a
    papermill chapter's parameter checks; `hide-cell` for the `parameters` cell and papermill's injected one."""
    if PARAMETER_TAGS & set(tags):
        return FOLDED
    if INSTALL_MARK in source or VALIDATION.match(source):
        return PLUMBING
    body = parse_cell(source)
    if body and all(is_plumbing_statement(node) for node in body):
        return PLUMBING
    return None


def split_export_imports(source: str) -> tuple[str, str] | None:
    """An `#| export` cell that opens with a block of imports and goes on with code, split into (the imports, the
    rest), the comments just above the first statement of the code going with it; None when there is nothing to split."""
    body = parse_cell(source)
    if not body or not is_plumbing_statement(body[0]) or all(is_plumbing_statement(node) for node in body):
        return None
    first = next(node for node in body if not is_plumbing_statement(node))
    start = min([first.lineno, *(d.lineno for d in getattr(first, "decorator_list", []))]) - 1
    lines = source.splitlines(True)
    while start > 0 and lines[start - 1].lstrip().startswith("#"):
        start -= 1
    head, rest = "".join(lines[:start]).strip("\n"), "".join(lines[start:]).strip("\n")
    return (head, rest) if head and rest else None


def hide_plumbing(nb, exported: set[int]):
    """Tag (in place) every plumbing cell of `nb` (`plumbing_tag`) and split the leading imports off the code cells at
    the indices `exported` (the `#| export` cells; `split_export_imports`): the first screen is then the chapter's."""
    cells = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            cells.append(cell)
            continue
        tags = list(cell.metadata.get("tags", []))
        split = split_export_imports(cell.source) if index in exported and not tags else None
        if split:
            imports = nbformat.v4.new_code_cell(split[0], metadata={"tags": [PLUMBING]})
            if cell.get("id"):
                imports.id = f"{cell.id}-imports"[:64]
            else:
                imports.pop("id", None)
            cell.source = split[1]
            cells.append(imports)
        tag = plumbing_tag(cell.source, tags)
        if tag and not {PLUMBING, "remove-input", "hide-input", FOLDED} & set(tags):
            cell.metadata["tags"] = [*tags, tag]
        cells.append(cell)
    nb.cells = cells
    return nb
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


def directive_tag(name: str, args: list[str]) -> str | None:
    "The Jupyter Book tag of one nbdev directive (`name`, `args` as `extract_directives` returns them)."
    name = name.rstrip(":")
    for key in (f"{name}: {' '.join(args)}".lower(), name):
        if key in DIRECTIVE_TAGS:
            return DIRECTIVE_TAGS[key]
    raise ValueError(f"unknown nbdev directive '#| {name} {' '.join(args)}': add it to DIRECTIVE_TAGS in {__file__}")


def subset_toc(toc: dict, pages: list[str]) -> dict:
    "The _toc.yml restricted to `pages` (parts left empty are dropped)."
    parts = []
    for part in toc.get("parts", []):
        chapters = [c for c in part.get("chapters", []) if c.get("file") in pages]
        if chapters:
            parts.append({**part, "chapters": chapters})
    return {**toc, "parts": parts} if parts else {k: v for k, v in toc.items() if k != "parts"}


def translate_cell(cell) -> dict:
    """Map the leading nbdev directives of one code cell to tags and strip them from its source (in place); returns
    the directives (nbdev's `extract_directives`: name -> arguments)."""
    lines = cell.source.splitlines(True)
    first = first_code_ln(lines)  # nbdev's split: leading directives (and cell magics), then code
    first = len(lines) if first is None else first
    leading = "".join(line for line in lines[:first] if not MAGIC.match(line))
    directives = extract_directives(nbformat.NotebookNode(source=leading), remove=False)
    if not directives:
        return directives
    tags = list(cell.metadata.get("tags", []))
    for name, args in directives.items():
        tag = directive_tag(name, args)
        if tag and tag not in tags:
            tags.append(tag)
    cell.source = "".join([line for line in lines[:first] if MAGIC.match(line)] + lines[first:]).strip("\n")
    if tags:
        cell.metadata["tags"] = tags
    return directives


def translate(nb, name: str | None = None):
    """Map `#|` directives of code cells to tags and strip them from the source, hide the plumbing (`hide_plumbing`),
    in place; with the page's `name`, also put its chapter label in front of its title (`label_title`)."""
    exported = set()
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and {"export", "exports"} & set(translate_cell(cell)):
            exported.add(index)
    hide_plumbing(nb, exported)
    return label_title(nb, name) if name else nb


def chapter_label(name: str) -> str | None:
    """The label the chapters use for a page, from its file name: "nbs/04d_baselines" -> "4d", "nbs/10_cost" -> "10";
    None for the first page (00) and the back matter (90-99: installing, references), which have no number."""
    prefix = Path(name).name.split("_")[0]
    label = prefix.lstrip("0")
    back_matter = prefix[:2].isdigit() and int(prefix[:2]) >= 90
    return None if not label or prefix == "00" or back_matter or not label[0].isdigit() else label


def label_title(nb, name: str):
    "Prefix the page's first level-1 heading with its `chapter_label` ('# Trivial baselines' -> '# 4d. Trivial baselines')."
    label = chapter_label(name)
    for cell in nb.cells:
        if label and cell.cell_type == "markdown" and cell.source.startswith("# "):
            if not cell.source.startswith(f"# {label}. "):
                cell.source = f"# {label}. {cell.source[2:]}"
            break
    return nb


def settings() -> dict[str, str]:
    "The nbdev settings (settings.ini [DEFAULT]): the one place the repository address is written."
    import configparser

    parser = configparser.ConfigParser(delimiters=["="])
    parser.read(ROOT / "settings.ini", encoding="utf-8")
    return dict(parser["DEFAULT"])


def book_config(config: dict, cfg: dict[str, str]) -> dict:
    "_config.yml with the repository address, branch and site address taken from settings.ini."
    config = dict(config)
    config["repository"] = {**config.get("repository", {}), "url": cfg["git_url"], "branch": cfg["branch"]}
    html = dict(config.get("html", {}))
    html["baseurl"] = cfg["doc_host"].rstrip("/") + cfg["doc_baseurl"].rstrip("/") + "/"
    config["html"] = html
    return config


def doc_page(name: str) -> str:
    "The page name nbdev gives a notebook in _modidx links: `nbs/02_attention` -> `attention.html`."
    return re.sub(r"^\d+[a-zA-Z0-9]*_", "", Path(name).name.lower()) + ".html"


REDIRECT = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>Redirecting to {target}</title>
<link rel="canonical" href="{target}"><meta http-equiv="refresh" content="0; url={target}">
<script>location.replace("{target}" + location.hash);</script></head>
<body><a href="{target}">{target}</a></body></html>
"""


def write_redirects(html_dir: Path, pages: list[str]) -> None:
    "One `<name>.html` per chapter for nbdev's doc links (keeps the #symbol anchor)."
    for name in pages:
        stub = html_dir / doc_page(name)
        if not stub.exists():
            stub.write_text(REDIRECT.format(target=f"{name}.html"))


def experiment_chapters() -> tuple[str, ...]:
    """The training chapters, one per benchmark of the task registry (`hkt_nb.lra.tasks.chapters`, the list the
    Makefile's `chapters` target runs): executed by `make chapters PRESET=...`, never retrained here."""
    from hkt_nb.lra.tasks import chapters

    return tuple(chapters())


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
    os.environ.update(QUIET_PROGRESS)

    t0 = time.time()
    pm.execute_notebook(str(path), str(path), parameters=parameters or {}, cwd=str(ROOT / "nbs"),
                        kernel_name="python3", language="python", progress_bar=False, log_output=False)
    print(f"  executed {path.relative_to(ROOT)} in {time.time() - t0:.1f} s", flush=True)


def reuse_outputs(nb, previous: Path) -> bool:
    """Give `nb` (a translated chapter, in place) the outputs of `previous`, the executed copy of an earlier build,
    when its code cells are exactly the same (`--reuse-outputs`: a rebuild after edits to text or style only);
    False, changing nothing, when there is no such copy or any code cell differs."""
    if not previous.exists():
        return False
    old = nbformat.read(previous, as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    executed = [cell for cell in old.cells if cell.cell_type == "code" and "injected-parameters" not in cell.metadata.get("tags", [])]
    if [cell.source for cell in code] != [cell.source for cell in executed]:
        return False
    for cell, done in zip(code, executed):
        cell.outputs, cell.execution_count = done.outputs, done.execution_count
    return True


def strip_rules(path: Path) -> None:
    """Remove horizontal rules (`---` lines) from markdown outputs, e.g. nbdev's `show_doc`: docutils allows a
    transition only at the top level of a document, and myst-nb nests outputs in a container (Sphinx then fails
    with an AssertionError in `visit_transition`)."""
    nb = nbformat.read(path, as_version=4)
    changed = False
    for cell in nb.cells:
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            text = output.get("data", {}).get("text/markdown")
            if text is not None:
                kept = "\n".join(line for line in text.splitlines() if line.strip() not in ("---", "***", "___"))
                if kept != text:
                    output["data"]["text/markdown"], changed = kept, True
    if changed:
        nbformat.write(nb, path)


def check_figures(path: Path):
    """A chapter that plots must show its figures: fail if it draws (a top-level `plt.`/`sns.` statement; plotting
    code inside a function that the chapter only defines draws nothing) but has no image output."""
    nb = nbformat.read(path, as_version=4)
    plots = any(re.match(r"\S.*\b(plt|sns)\.", line) for c in nb.cells if c.cell_type == "code"
                for line in c.source.splitlines())
    images = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    if plots and not images:
        sys.exit(f"{path.relative_to(ROOT)} draws figures but has no image output (matplotlib backend?)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="smoke", help="preset for experiment chapters with no executed copy")
    ap.add_argument("--no-execute", action="store_true", help="only prepare the sources (for debugging)")
    ap.add_argument("--pages", nargs="+", help="build only these _toc.yml entries (e.g. nbs/00_index nbs/99_references)")
    ap.add_argument("--reuse-outputs", action="store_true",
                    help="take a chapter's outputs from the previous build's copy when its code is unchanged "
                         "(a rebuild after edits to text or style; results/ or library changes need a full build)")
    args = ap.parse_args(argv)
    start = time.time()
    pages = toc_files(ROOT / "_toc.yml")
    if args.pages:
        unknown = set(args.pages) - set(pages)
        if unknown:
            sys.exit(f"--pages: {sorted(unknown)} not in _toc.yml")
        pages = [p for p in pages if p in args.pages or p == pages[0]]

    previous = SRC.with_name("book_src.previous")  # the last build's executed copies (--reuse-outputs)
    shutil.rmtree(previous, ignore_errors=True)
    if SRC.exists():
        if args.reuse_outputs:
            SRC.rename(previous)
        else:
            shutil.rmtree(SRC)
    SRC.mkdir(parents=True)
    config = book_config(yaml.safe_load((ROOT / "_config.yml").read_text()), settings())
    (SRC / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    (SRC / "_toc.yml").write_text(yaml.safe_dump(subset_toc(yaml.safe_load((ROOT / "_toc.yml").read_text()), pages),
                                                 sort_keys=False))
    shutil.copy(ROOT / "references.bib", SRC / "references.bib")
    experiments = experiment_chapters()
    for name in pages:
        src = ROOT / f"{name}.ipynb"
        if not src.exists():
            sys.exit(f"_toc.yml lists {name}, but {src} does not exist")
        dest = SRC / f"{name}.ipynb"
        dest.parent.mkdir(parents=True, exist_ok=True)
        nb = nbformat.read(src, as_version=4)
        if Path(name).name in experiments:
            done = executed_copy(Path(name).name)
            if done is not None:
                print(f"  {name}: using executed copy {done.relative_to(ROOT)}", flush=True)
                nbformat.write(translate(nbformat.read(done, as_version=4), name), dest)
                continue
            nbformat.write(translate(nb, name), dest)
            if not args.no_execute:
                execute(dest, {"preset": args.preset})
            continue
        nb = translate(nb, name)
        if args.reuse_outputs and reuse_outputs(nb, previous / f"{name}.ipynb"):
            print(f"  {name}: code unchanged, outputs of the previous build reused", flush=True)
            nbformat.write(nb, dest)
            continue
        nbformat.write(nb, dest)
        if not args.no_execute:
            execute(dest)
    if args.no_execute:
        return
    for name in pages:
        strip_rules(SRC / f"{name}.ipynb")
        check_figures(SRC / f"{name}.ipynb")
    cmd = [str(Path(sys.executable).parent / "jupyter-book"), "build", str(SRC), "--path-output", str(ROOT / "_build"), "-W", "-n", "--keep-going"]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)
    write_redirects(ROOT / "_build" / "_build" / "html", pages)
    print(f"\nThe book is at {ROOT / '_build' / '_build' / 'html' / 'index.html'} "
          f"(built in {(time.time() - start) / 60:.1f} min)")


if __name__ == "__main__":
    main()
