"""Packaging (issues 8 and 13): the wheel is built FROM the sdist, as pip and the release workflow do, and
both are checked: the sdist holds what a build needs and no data or results; the wheel holds only the library;
the metadata says what settings.ini says (core requirements torch, numpy and safetensors, the extras, SPDX licence,
URLs)."""
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NEVER_SHIPPED = (".ipynb", ".parquet", ".arrow", ".pt", ".npz", ".json", ".pyc")


def clean_env(**extra) -> dict:
    """This process's environment without what would make a subprocess see this checkout instead of the venv under
    test: PYTHONPATH (a worktree on it holds hkt_nb, and after the build hkt_nb.egg-info, so pip would take the
    wheel for installed already and skip it), PYTHONHOME, PYTHONSTARTUP, PYTHONUSERBASE and a virtualenv's marker."""
    hidden = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV", "PIP_TARGET", "PIP_PREFIX")
    return {**{k: v for k, v in os.environ.items() if k not in hidden}, **extra}


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    "`python -m build` with no target builds the sdist, then the wheel from the unpacked sdist."
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)], check=True,
                   capture_output=True, text=True)
    (sdist,) = out.glob("hkt_nb-*.tar.gz")
    (wheel,) = out.glob("hkt_nb-*.whl")
    return sdist, wheel


@pytest.mark.slow
def test_sdist_holds_what_a_build_needs_and_no_data(dists):
    sdist, _ = dists
    names = [name.split("/", 1)[1] for name in tarfile.open(sdist).getnames() if "/" in name]
    for needed in ("settings.ini", "setup.py", "pyproject.toml", "README.md", "LICENSE", "CITATION.cff",
                   "hkt_nb/__init__.py", "hkt_nb/py.typed"):
        assert needed in names, needed
    top = {name.split("/")[0] for name in names}
    assert not top & {"nbs", "results", "tests", "scripts", "_build", "data", "checkpoints"}, top
    assert not [name for name in names if name.endswith(NEVER_SHIPPED)]


@pytest.mark.slow
def test_wheel_from_sdist_holds_only_the_library(dists):
    _, wheel = dists
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names}
    dist_info = next(t for t in top if t.endswith(".dist-info"))
    assert top == {"hkt_nb", dist_info}, top
    assert {"hkt_nb/attention.py", "hkt_nb/model.py", "hkt_nb/py.typed", f"{dist_info}/licenses/LICENSE"} <= set(names)
    assert not [name for name in names if name.endswith(NEVER_SHIPPED)]


@pytest.mark.slow
def test_wheel_metadata_comes_from_settings(dists, settings):
    _, wheel = dists
    archive = zipfile.ZipFile(wheel)
    dist_info = next(n.split("/")[0] for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
    meta = Parser().parsestr(archive.read(f"{dist_info}/METADATA").decode())
    cfg = settings
    assert meta["Version"] == cfg["version"]
    assert meta["License-Expression"] == "Apache-2.0"
    assert not [c for c in meta.get_all("Classifier") if c.startswith("License ::")]  # SPDX, not a classifier
    assert meta["Requires-Python"] == f">={cfg['min_python']}"
    core = sorted(r for r in meta.get_all("Requires-Dist") if "extra ==" not in r)
    assert [re.split(r"[<>=;\s]", r)[0] for r in core] == ["numpy", "safetensors", "torch"], core  # no Hub client
    assert {"lra", "theory", "hub", "book", "dev", "all"} <= set(meta.get_all("Provides-Extra"))
    lra = {r.split(";")[0].strip() for r in meta.get_all("Requires-Dist") if 'extra == "lra"' in r}
    assert lra == set(cfg["lra_requirements"].split())
    for extra in ("hub", "all"):  # the Hub client comes only with an extra
        assert "huggingface_hub" in {r.split(";")[0].strip() for r in meta.get_all("Requires-Dist") if f'extra == "{extra}"' in r}
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert urls["Source"] == cfg["git_url"] and urls["Issues"] == cfg["git_url"] + "/issues"
    assert urls["Documentation"] == cfg["doc_host"] + cfg["doc_baseurl"] + "/"
    assert urls["Paper"] == cfg["paper_url"]
    entry_points = archive.read(f"{dist_info}/entry_points.txt").decode()
    assert "hkt-train = hkt_nb.lra.runs:main" in entry_points


def readme_example() -> str:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    return next(block for block in blocks if "HierarchicalAttention" in block)


@pytest.fixture(scope="module")
def venv(dists, tmp_path_factory):
    """A fresh venv with the wheel installed (no deps: torch, numpy and the rest are borrowed, read-only, from this
    environment), every subprocess run with `clean_env` (never this checkout on PYTHONPATH). Returns its python."""
    _, wheel = dists
    folder = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True, env=clean_env())
    python = folder / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True,
                   env=clean_env())
    import numpy
    import torch

    borrowed = {str(Path(module.__file__).parents[1]) for module in (torch, numpy)}
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True, env=clean_env()).stdout.strip()
    (Path(site) / "borrowed_torch.pth").write_text("\n".join(sorted(borrowed)) + "\n")
    return python


def test_clean_env_hides_this_checkout(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    env = clean_env(OMP_NUM_THREADS="1")
    assert "PYTHONPATH" not in env and env["OMP_NUM_THREADS"] == "1" and env["PATH"] == os.environ["PATH"]


@pytest.mark.slow
def test_wheel_installs_in_a_clean_venv_and_runs_the_readme_example(venv, tmp_path):
    "The README's example runs in the venv and imports hkt_nb from the installed wheel (never from this checkout)."
    script = tmp_path / "example.py"
    script.write_text(readme_example() + "\nimport hkt_nb\nprint(hkt_nb.__file__)\nprint(tuple(y.shape))\n")
    out = subprocess.run([str(venv), str(script)], capture_output=True, text=True, cwd=tmp_path,
                         env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    location, shape = out.stdout.strip().splitlines()[-2:]
    assert location.startswith(str(venv.parents[1])), location
    assert shape == "(4, 1000, 256)"


@pytest.mark.slow
def test_records_url_comes_from_the_wheels_source_url(dists, venv, settings, tmp_path, monkeypatch):
    """Issue 20, item 7: installed from a wheel with no clone around it (Colab), `records_url()` names the
    repository of the `Source` entry of `Project-URL`, not `Home-page` (the book's site). Checked twice: on the
    METADATA of the wheel built from the sdist, read with `importlib.metadata.PathDistribution`, and by calling
    `records_url()` in the venv the wheel is installed in, from a folder outside any clone."""
    from importlib.metadata import PathDistribution

    from hkt_nb.train import workspace

    _, wheel = dists
    archive = zipfile.ZipFile(wheel)
    dist_info = next(n.split("/")[0] for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
    archive.extractall(tmp_path / "wheel", [n for n in archive.namelist() if n.startswith(dist_info)])
    meta = PathDistribution(tmp_path / "wheel" / dist_info).metadata
    owner_repo = settings["git_url"].split("github.com/", 1)[1]
    expected = f"https://raw.githubusercontent.com/{owner_repo}/v{settings['version']}/results"
    assert "github.com" not in (meta.get("Home-page") or "")  # the book's site: following it was the bug
    assert f"Source, {settings['git_url']}" in meta.get_all("Project-URL")
    monkeypatch.setattr(workspace, "_clone_root", lambda start: None)  # as if no clone were around
    monkeypatch.setattr(workspace.metadata, "metadata", lambda name: meta)
    assert workspace.records_url() == expected
    outside = tmp_path / "colab"
    outside.mkdir()
    code = "import hkt_nb.train.workspace as w; print(w.__file__); print(w.records_url())"
    out = subprocess.run([str(venv), "-c", code], capture_output=True, text=True, cwd=outside,
                         env=clean_env(OMP_NUM_THREADS="1", HF_DATASETS_OFFLINE="1"))
    assert out.returncode == 0, out.stderr[-3000:]
    location, url = out.stdout.strip().splitlines()[-2:]
    assert location.startswith(str(venv.parents[1])) and url == expected, out.stdout
