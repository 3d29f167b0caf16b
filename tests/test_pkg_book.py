"""The book build reads nbdev directives with nbdev's own parser (issue 9, item 12): `# | hide`, `#| hide:`
and an indented `  #| echo: false` are directives for nbdev, so they are for the book too (hidden, not
shown as code, and never a crash); a `#|` line after code is code for both; a cell magic stays."""
import importlib.util
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
                                                   "nbs/00_index", "nbs/99_references")] == ["4d", "10", "5", None, None]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Trivial baselines\n\n> what they are"),
                                         nbformat.v4.new_markdown_cell("# not the title")])
    build_book.translate(nb, "nbs/04d_baselines")
    assert nb.cells[0].source == "# 4d. Trivial baselines\n\n> what they are" and nb.cells[1].source == "# not the title"
    build_book.translate(nb, "nbs/04d_baselines")  # once only
    assert nb.cells[0].source.startswith("# 4d. Trivial baselines")
    index = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# HKT")])
    assert build_book.translate(index, "nbs/00_index").cells[0].source == "# HKT"
