"""The book build reads nbdev directives with nbdev's own parser (issue 9, item 12): `# | hide`, `#| hide:`
and an indented `  #| echo: false` are directives for nbdev, so they are for the book too (hidden, not
shown as code, and never a crash); a `#|` line after code is code for both; a cell magic stays."""
import importlib.util
import re
from pathlib import Path

import nbformat
import pytest
from nbdev.process import extract_directives

ROOT = Path(__file__).resolve().parents[1]


def translated(build_book, source: str, tags=()):
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": list(tags)} if tags else {})
    build_book.translate_cell(cell)
    return cell.source, cell.metadata.get("tags", [])


@pytest.mark.parametrize("source, tag", [
    ("#| hide\nx = 1", "remove-cell"),
    ("# | hide\nx = 1", "remove-cell"),
    ("#| hide:\nx = 1", "remove-cell"),
    ("#|hide\nx = 1", "remove-cell"),
    ("  #| echo: false\nx = 1", "remove-input"),
    ("#| echo: false\nx = 1", "remove-input"),
    ("#| echo:false\nx = 1", "remove-input"),
    ("#| output: false\nx = 1", "remove-output"),
    ("#| code-fold: true\nx = 1", "hide-input"),
    ("#| default_exp lra.runs\n", "remove-cell"),
])
def test_directive_spellings_nbdev_accepts(build_book, source, tag):
    assert extract_directives(nbformat.NotebookNode(source=source), remove=False), "nbdev reads a directive"
    code, tags = translated(build_book, source)
    assert tag in tags
    assert "#|" not in code and "# |" not in code
    assert code == source.split("\n", 1)[1].strip("\n")


@pytest.mark.parametrize("source", ["#| export\ndef f():\n    return 1", "#| exports\nx = 1", "#| notest\nx = 1"])
def test_export_directives_keep_the_code_visible(build_book, source):
    code, tags = translated(build_book, source)
    assert tags == [] and code == source.split("\n", 1)[1]


def test_directive_after_code_is_code_for_nbdev_and_the_book(build_book):
    source = "x = 1\n#| hide"
    assert extract_directives(nbformat.NotebookNode(source=source), remove=False) == {}
    assert translated(build_book, source) == (source, [])


def test_cell_magic_stays_and_existing_tags_are_kept(build_book):
    code, tags = translated(build_book, "%%time\n#| echo: false\nx = 1", tags=["parameters"])
    assert code == "%%time\nx = 1" and tags == ["parameters", "remove-input"]


def test_several_directives(build_book):
    code, tags = translated(build_book, "#| hide\n#| eval: false\nx = 1")
    assert code == "x = 1" and set(tags) == {"remove-cell", "skip-execution"}


def test_unknown_directive_is_a_clear_error(build_book):
    with pytest.raises(ValueError, match="unknown nbdev directive.*frobnicate"):
        translated(build_book, "#| frobnicate\nx = 1")


@pytest.mark.parametrize("chapter", sorted(p.name for p in (ROOT / "nbs").glob("*.ipynb")))
def test_every_chapter_translates(build_book, chapter):
    "Every directive in every chapter is one the book knows (the build would stop on it otherwise)."
    notebook = build_book.translate(nbformat.read(ROOT / "nbs" / chapter, as_version=4))
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert extract_directives(nbformat.NotebookNode(source=cell.source), remove=False) == {}, cell.source[:80]


def load_tag_cells():
    spec = importlib.util.spec_from_file_location("tag_cells", ROOT / "scripts" / "tag_cells.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("source, tags, hide", [
    ('rows = [{"model": m} for m in models]\npd.DataFrame(rows).round(2)', [], True),
    ('thr = sel.groupby(["task"])["x"].mean().unstack("model")\nthr.round(1)', [], True),
    ("def table(rows):\n    print(f\"{'T':>6} {'L':>2}\")", [], True),
    ('df = pd.DataFrame(rows)\nassert len(df) == 3', [], False),            # an example-test teaches
    ('#| export\ndef summary(rows):\n    return pd.DataFrame(rows)', [], False),
    ('#| echo: false\npd.DataFrame(rows)', [], False),                      # already hidden
    ('pd.DataFrame(rows)', ["hide-input"], False),
    ('preset = "smoke"', ["parameters"], False),
    ('fig, ax = plt.subplots()\nax.plot(pd.DataFrame(h)["loss"])', [], False),  # figures: the owner's choice
    ('x = layer(x)\nprint(x.shape)', [], False),
])
def test_tag_cells_hides_only_table_reshaping_code(source, tags, hide):
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": tags} if tags else {})
    assert load_tag_cells().reshapes_a_table(cell) is hide


def test_pages_carry_the_chapter_labels_the_text_uses(build_book):
    "The chapters say 'chapter 4d'; the built page of nbs/04d_baselines is titled '4d. Trivial baselines'."
    import nbformat

    assert [build_book.chapter_label(n) for n in ("nbs/04d_baselines", "nbs/10_cost", "nbs/05_train",
                                                   "nbs/00_index", "nbs/99_references", "nbs/98_install", "nbs/09_results")] == [
        "4d", "10", "5", None, None, None, "9"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Trivial baselines\n\n> what they are"),
                                         nbformat.v4.new_markdown_cell("# not the title")])
    build_book.translate(nb, "nbs/04d_baselines")
    assert nb.cells[0].source == "# 4d. Trivial baselines\n\n> what they are" and nb.cells[1].source == "# not the title"
    build_book.translate(nb, "nbs/04d_baselines")  # once only
    assert nb.cells[0].source.startswith("# 4d. Trivial baselines")
    index = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# HKT")])
    assert build_book.translate(index, "nbs/00_index").cells[0].source == "# HKT"


# ---- plumbing out of sight (issue 33, item 2): every chapter opens with its idea --------------------------------
INSTALL = ("# Installs hkt_nb (this book's version) where it is missing, e.g. on Colab.\n"
           "# Written by scripts/install_cell.py from settings.ini.\nimport sys\nif sys: pass")
SHOW_DOC_FALLBACK = ("try:\n    from nbdev.showdoc import show_doc\nexcept ImportError:  # no nbdev\n"
                     "    def show_doc(*args, **kwargs): return None")


def plumbing(build_book, source: str, tags=()):
    "The tags and sources of the cells the build makes of one code cell (directives and all)."
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source, metadata={"tags": list(tags)})])
    build_book.translate(notebook)
    return [(cell.source, cell.metadata.get("tags", [])) for cell in notebook.cells]


@pytest.mark.parametrize("source, tags, shown", [
    ("#| export\nfrom __future__ import annotations\n\nimport torch\nfrom torch import nn", [], False),
    ("#| export\nfrom hkt_nb.model import HKTClassifier\n\n_all_ = ['HKTClassifier']", [], False),  # nbdev's _all_
    ("import matplotlib.pyplot as plt\n" + SHOW_DOC_FALLBACK, [], False),  # helper imports and the show_doc fallback
    ("#| hide\n" + INSTALL, [], False),
    (INSTALL, [], False),  # the install cell, even without its `#| hide`
    ("import pandas as pd\npd.set_option('display.max_colwidth', None)", [], False),  # a display option
    ("# validate the parameters (papermill may inject strings)\nif seed < 0:\n    raise ValueError('seed')", [], False),
    ("#| default_exp lra.runs", [], False),
    ('preset = "smoke"', ["parameters"], "folded"),  # papermill's parameters: one click away
    ('preset = "cpu"', ["injected-parameters"], "folded"),
    ("#| export\ndef f(x):\n    return x", [], True),  # library code is the chapter's content
    ("import torch\nx = torch.zeros(3)\nx", [], True),  # an example's imports are part of the example
    ("from hkt_nb.model import HKTClassifier\nmodel = HKTClassifier.from_pretrained(folder)", [], True),
    ("try:\n    import fcntl\nexcept OSError:\n    fcntl = None", [], True),  # not an import guard
    ("try:\n    import fcntl\nexcept ImportError:\n    fcntl = None", [], False),  # an import guard
    ("try:\n    x = load()\nexcept ImportError:\n    x = None", [], True),  # code that may fail to import
    ("# model.push_to_hub(name)", [], True),  # a commented example
    ("#| exports\nx = 1", [], True),
    ("_all_ = ['f']\nprint(_all_)", [], True),
    ("!pip install hkt_nb", [], True),  # not Python: left as it is
    ("import warnings\n\nwith warnings.catch_warnings():\n    warnings.simplefilter('ignore')\n    from tqdm.auto import tqdm",
     [], False),  # a quiet import
    ("import warnings\n\nwith warnings.catch_warnings():\n    x = risky()", [], True),  # code under a filter is code
])
def test_plumbing_cells_are_hidden_and_the_rest_shown(build_book, source, tags, shown):
    (code, found), = plumbing(build_book, source, tags)
    if shown == "folded":
        assert "hide-cell" in found and "remove-cell" not in found
    elif shown:
        assert not {"remove-cell", "hide-cell"} & set(found), found
    else:
        assert "remove-cell" in found
    assert "#|" not in code


def test_the_import_block_of_an_export_cell_is_split_off_and_hidden(build_book):
    source = ("#| export\nfrom __future__ import annotations\n\nimport numpy as np\n\n"
              "# every task reserves id 0\nPAD_ID = 0\n\n\n@dataclass\nclass A:\n    x: int = PAD_ID")
    (imports, import_tags), (code, code_tags) = plumbing(build_book, source)
    assert imports == "from __future__ import annotations\n\nimport numpy as np" and import_tags == ["remove-cell"]
    assert code.startswith("# every task reserves id 0\nPAD_ID = 0") and code_tags == []
    assert imports + "\n\n" + code == source.split("\n", 1)[1]  # nothing lost, the order kept
    # a decorator stays with its function; a cell that does not start with imports is left whole
    (imports, _), (code, _) = plumbing(build_book, "#| export\nimport math\n@functools.cache\ndef f(): return math.pi")
    assert imports == "import math" and code == "@functools.cache\ndef f(): return math.pi"
    assert len(plumbing(build_book, "#| export\nX = 1\nimport math")) == 1
    assert len(plumbing(build_book, "import math\nprint(math.pi)")) == 1  # only export cells are split


def test_split_cells_keep_unique_ids(build_book):
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("#| export\nimport math\nX = math.pi")])
    build_book.translate(notebook)
    ids = [cell.id for cell in notebook.cells]
    assert len(ids) == 2 and len(set(ids)) == 2
    nbformat.validate(notebook)


PLUMBING_LINE = re.compile(r"^\s*($|#|(from\s+[\w.]+\s+)?import\s|try:|except\s*\(?(ImportError|ModuleNotFoundError)\b"
                           r"|def show_doc\(|(_all_|__all__)\s*=|(pd|pandas)\.set_option\(|warnings\.(filterwarnings|simplefilter)\("
                           r"|with warnings\.catch_warnings\(\):)")


def looks_like_plumbing(source: str) -> bool:
    """An independent, line-by-line reading of the rule: the install cell, parameter checks, or a cell whose every
    line is an import (or a line inside its parentheses), an import guard with the show_doc fallback, `_all_`, a
    display option, an import under `warnings.catch_warnings()`, a comment or blank."""
    if "Written by scripts/install_cell.py" in source or source.startswith("# validate the parameters"):
        return True
    depth, handler, code = 0, None, False
    for line in source.splitlines():
        indent = len(line) - len(line.lstrip())
        if handler is not None and (indent > handler or not line.strip()):
            continue  # the body of an `except ImportError:` (the fallback)
        handler = indent if re.match(r"\s*except\s*\(?(ImportError|ModuleNotFoundError)\b", line) else None
        if depth == 0 and not PLUMBING_LINE.match(line):
            return False
        depth += line.count("(") - line.count(")")
        code = code or not re.match(r"\s*(#|$)", line)
    return code


def visible(cell) -> bool:
    return not {"remove-cell", "hide-cell"} & set(cell.metadata.get("tags", []))


@pytest.mark.parametrize("chapter", sorted(p.stem for p in (ROOT / "nbs").glob("*.ipynb")))
def test_real_chapters_hide_exactly_their_plumbing_and_open_with_their_idea(build_book, chapter):
    """On the real chapters: the cells the build hides as plumbing are exactly those that a line-by-line reading
    calls plumbing (beside those that `#| hide` / `default_exp` hide), no shown cell starts with an import block, and
    the first thing after the title is prose, an equation or a picture: a Markdown cell or a cell shown only by its
    output (a folded parameters cell may come before it)."""
    path = ROOT / "nbs" / f"{chapter}.ipynb"
    by_directive = set()
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "code":
            build_book.translate_cell(cell)
            if "remove-cell" in cell.metadata.get("tags", []):
                by_directive.add(cell.source)
    notebook = build_book.translate(nbformat.read(path, as_version=4), f"nbs/{chapter}")
    code = [cell for cell in notebook.cells if cell.cell_type == "code" and cell.source not in by_directive]
    hidden = [cell.source[:100] for cell in code if "remove-cell" in cell.metadata.get("tags", [])]
    expected = [cell.source[:100] for cell in code if looks_like_plumbing(cell.source)]
    assert hidden == expected
    assert all(not cell.source.startswith("from __future__") for cell in code if visible(cell))
    assert notebook.cells[0].cell_type == "markdown" and notebook.cells[0].source.startswith("# ")
    shown = [cell for cell in notebook.cells[1:] if visible(cell)]
    first = shown[0]
    assert first.cell_type == "markdown" or "remove-input" in first.metadata.get("tags", []), (
        f"{chapter} opens with code: {first.source[:120]}")


def test_reuse_outputs_only_when_the_code_is_unchanged(build_book, tmp_path):
    "`--reuse-outputs` takes an earlier build's outputs for a chapter whose code cells are the same, else none."
    def chapter(code):
        return nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# T"), nbformat.v4.new_code_cell(code)])
    done = chapter("1 + 1")
    done.cells[1].outputs = [nbformat.v4.new_output("execute_result", data={"text/plain": "2"}, execution_count=1)]
    done.cells.insert(1, nbformat.v4.new_code_cell("preset = 'smoke'", metadata={"tags": ["injected-parameters"]}))
    nbformat.write(done, tmp_path / "old.ipynb")
    same = chapter("1 + 1")
    same.cells[0].source = "# T, text edited"
    assert build_book.reuse_outputs(same, tmp_path / "old.ipynb")
    assert same.cells[1].outputs[0]["data"]["text/plain"] == "2" and same.cells[0].source == "# T, text edited"
    changed = chapter("1 + 2")
    assert not build_book.reuse_outputs(changed, tmp_path / "old.ipynb") and changed.cells[1].outputs == []
    assert not build_book.reuse_outputs(chapter("1 + 1"), tmp_path / "missing.ipynb")
