"""A chapter opened alone (issue 35, item 1, Colab): the notebook in an empty folder, the library importable, no results/
beside it. Each chapter that reads committed records fetches them (`committed_results_dir`, chapter 9) and states the
same results as in the repository's nbs/. `HKT_NB_RECORDS` points at the repository's results/, a local stand-in for
the records' address at the book's version."""
import importlib.util
import json
import os
import re
import shutil
import time
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"

# chapter -> the ids of the cells whose outputs state results (compared between the two runs); None: every cell's
CHAPTERS = {
    "00_index": ["21f3dcea"],  # the first page's results table and the sentences under it
    "04a_listops": ["4522e35a", "2c0989e5"],
    "04d_baselines": ["a7ff9d07"],
    "05_train": ["5af3a2ce", "0001e5b8"],
    "05b_runs": ["d76606b8"],
    "05f_workspace": ["72f823a8", "de1a2d0e"],
    "05g_pilot": None,
    "09_results": None,
    "11_kernel": ["53f909f0", "8d44aaab"],
    "12_asymmetry": None,
    "14_approximation": ["81a7c4b8", "391ea1d2"],
}
SLOW = {"04a_listops", "05_train", "05b_runs", "05f_workspace", "05g_pilot", "09_results", "11_kernel", "12_asymmetry", "14_approximation"}
_VARYING = re.compile(r"\d+(\.\d+)? ?(ms|s)\b|at 0x[0-9a-f]+|T_[0-9a-f]{5}")  # timings, addresses, Styler ids


def _execute(path: Path, cwd: Path):
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


def _stated(nb, ids, folder: Path | None = None) -> dict:
    """{cell id: the text of its outputs (stdout, text/markdown, text/plain, text/html), timings and addresses masked,
    `folder`/ (where the notebook ran alone) removed so that its results/ reads as the repository's}
    of the cells `ids` (None: every code cell but `show_doc`'s, whose source links depend on the notebook's folder)."""
    out = {}
    for cell in nb.cells:
        if cell.cell_type != "code" or (ids is not None and cell.get("id") not in ids) or (
                ids is None and "show_doc(" in cell.source):
            continue
        texts = []
        for o in cell.get("outputs", []):
            if o.get("output_type") == "stream" and o.get("name") == "stdout":  # stderr: progress bars
                texts.append(o["text"])
            for kind in ("text/markdown", "text/plain", "text/html"):
                if kind in o.get("data", {}):
                    texts.append(o["data"][kind])
        text = "".join(texts).replace(f"{folder}/", "") if folder is not None else "".join(texts)
        out[cell.get("id")] = _VARYING.sub("<t>", text)
    return out


@pytest.fixture
def alone_env(monkeypatch):
    monkeypatch.delenv("HKT_RESULTS_DIR", raising=False)  # the override would win over ./results
    monkeypatch.setenv("HKT_NB_RECORDS", str(RESULTS))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def test_the_install_cell_is_a_no_op_here():
    "The chapters' first cell installs only where a module is missing: here every one imports, so it does nothing."
    nb = nbformat.read(ROOT / "nbs" / "00_index.ipynb", as_version=4)
    cell = next(c for c in nb.cells if "pip" in c.source and "find_spec" in c.source)
    modules = re.search(r"for m in \(([^)]*)\)", cell.source).group(1)
    names = [m.strip().strip("'\"") for m in modules.split(",") if m.strip()]
    assert names[0] == "hkt_nb" and all(importlib.util.find_spec(m) is not None for m in names), names


def test_the_variants_index_lists_the_committed_variant_runs():
    "results/variants.json names exactly the variant runs committed (a chapter opened alone fetches them by it)."
    from hkt_nb.lra.results import VARIANTS_INDEX

    runs = sorted(r["run"] for p in RESULTS.glob("*-seed*.json") if (r := json.loads(p.read_text())).get("variant"))
    assert runs and json.loads((RESULTS / VARIANTS_INDEX).read_text()) == {"runs": runs}


def test_a_glob_of_the_registries_names_the_committed_files():
    "Every committed file a chapter reads by these globs is named by `committed_names` (nothing is left out)."
    from hkt_nb.lra.headline import HEADLINE_RECORDS
    from hkt_nb.lra.results import committed_names

    variants = json.loads((RESULTS / "variants.json").read_text())["runs"]
    for pattern in (*HEADLINE_RECORDS, "checkpoints/*.pt"):
        on_disk = {str(p.relative_to(RESULTS)) for p in RESULTS.glob(pattern) if p.name != "variants.json"}
        assert on_disk and on_disk <= set(committed_names(pattern, variants=variants)), (pattern, on_disk - set(committed_names(pattern, variants=variants)))


def test_a_folder_of_its_own_runs_is_left_alone(tmp_path, alone_env):
    "A results folder with runs trained there (no marker) gets nothing fetched; an empty one gets what is asked for."
    from hkt_nb.lra.results import FETCHED_MARKER, committed_results_dir

    own = tmp_path / "own"
    own.mkdir()
    (own / "listops-hkt-cpu_small-seed0.json").write_text("{}")
    assert committed_results_dir("baselines/*-cpu.json", results_dir=own) == own.resolve()
    assert sorted(p.name for p in own.rglob("*")) == ["listops-hkt-cpu_small-seed0.json"]
    empty = committed_results_dir("baselines/*-paper.json", results_dir=tmp_path / "empty")  # only ListOps' committed
    committed = sorted(str(p.relative_to(RESULTS)) for p in RESULTS.glob("baselines/*-paper.json"))
    assert sorted(str(p.relative_to(empty)) for p in empty.rglob("*.json")) == committed == ["baselines/listops-paper.json"]
    marker = json.loads((empty / FETCHED_MARKER).read_text())  # what is not committed is not asked for again
    assert marker["absent"] == ["baselines/imdb-paper.json", "baselines/scifar10-paper.json"]


def test_an_unreachable_address_raises(tmp_path, monkeypatch):
    from hkt_nb.lra.results import committed_results_dir

    monkeypatch.delenv("HKT_RESULTS_DIR", raising=False)
    monkeypatch.setenv("HKT_NB_RECORDS", str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="could be fetched"):
        committed_results_dir("baselines/*-cpu.json", results_dir=tmp_path / "results")


def test_only_files_the_source_lacks_are_remembered_as_absent(tmp_path, monkeypatch):
    """A file the stand-in address does not hold is written into the marker and not asked for again; one that could
    not be reached (a network failure: here a URL that no server answers) is not, so the next call asks again."""
    import json

    from hkt_nb.lra.results import FETCHED_MARKER, committed_results_dir

    monkeypatch.delenv("HKT_RESULTS_DIR", raising=False)
    source = tmp_path / "source"
    shutil.copytree(RESULTS / "baselines", source / "baselines")
    (source / "baselines" / "imdb-cpu.json").unlink()  # "not committed"
    monkeypatch.setenv("HKT_NB_RECORDS", str(source))
    folder = committed_results_dir("baselines/*-cpu.json", results_dir=tmp_path / "a")
    assert json.loads((folder / FETCHED_MARKER).read_text())["absent"] == ["baselines/imdb-cpu.json"]
    assert (folder / "baselines" / "listops-cpu.json").read_bytes() == (RESULTS / "baselines" / "listops-cpu.json").read_bytes()
    (folder / "baselines" / "listops-cpu.json").unlink()
    monkeypatch.setenv("HKT_NB_RECORDS", "http://127.0.0.1:9")  # the discard port: the connection is refused
    committed_results_dir("baselines/*-cpu.json", results_dir=folder)
    assert json.loads((folder / FETCHED_MARKER).read_text())["absent"] == ["baselines/imdb-cpu.json"]  # unchanged


@pytest.mark.parametrize("chapter", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in CHAPTERS])
def test_a_chapter_opened_alone_states_the_repositorys_results(chapter, tmp_path, alone_env):
    source = ROOT / "nbs" / f"{chapter}.ipynb"
    alone = tmp_path / "colab"
    alone.mkdir()
    shutil.copy(source, alone / source.name)
    start = time.perf_counter()
    fetched_nb = _execute(alone / source.name, alone)
    seconds = time.perf_counter() - start
    fetched = alone / "results"
    files = [p for p in fetched.rglob("*") if p.is_file() and p.name != ".fetched"]
    assert (fetched / ".fetched").is_file() and files  # it fetched, into ./results
    for path in files:  # each file fetched is the committed one
        assert path.read_bytes() == (RESULTS / path.relative_to(fetched)).read_bytes(), path
    repo_nb = _execute(source, source.parent)
    ids = CHAPTERS[chapter]
    alone_out, repo_out = _stated(fetched_nb, ids, alone), _stated(repo_nb, ids)
    assert ids is None or set(alone_out) == set(ids)
    assert any(alone_out.values())
    for cid in repo_out:
        assert alone_out[cid] == repo_out[cid], (chapter, cid)
    print(f"{chapter}: alone in {seconds:.0f} s")
