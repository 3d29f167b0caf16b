"""The core layer is light (issue 8): importing hkt_nb and its core modules loads torch and numpy, and none of
the data, plotting or authoring stacks. Checked in a fresh interpreter through `sys.modules`, against the
baseline of `import torch, numpy` alone (torch itself imports tqdm when tqdm happens to be installed; in a
clean `pip install hkt_nb` it is not)."""
import json
import subprocess
import sys

import pytest

CORE = ("hkt_nb", "hkt_nb.attention", "hkt_nb.model", "hkt_nb.downsampling", "hkt_nb.cost")
HEAVY = ("datasets", "pandas", "matplotlib", "seaborn", "pyarrow", "PIL", "tqdm", "fastcore")
TOP_LEVEL = ("HierarchicalAttention", "MultiHeadAttention", "HKTClassifier", "ClassifierConfig")


def fresh_python(code: str, repo_root) -> subprocess.CompletedProcess:
    "Run `code` in a fresh interpreter that imports hkt_nb from `repo_root` (output captured)."
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=repo_root,
                          env={"PATH": "", "PYTHONPATH": str(repo_root)})


def loaded_after(statement: str, repo_root) -> set[str]:
    "Top-level names in sys.modules after running `statement` in a fresh interpreter."
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = fresh_python(code, repo_root)
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.splitlines()[-1]))


@pytest.fixture(scope="module")
def baseline(repo_root) -> set[str]:
    return loaded_after("import torch, numpy", repo_root)


def added_heavy(statement: str, repo_root, baseline) -> list[str]:
    return sorted((loaded_after(statement, repo_root) - baseline) & set(HEAVY))


def test_baseline_is_torch_and_numpy(baseline):
    assert {"torch", "numpy"} <= baseline
    assert not baseline & (set(HEAVY) - {"tqdm"}), sorted(baseline & set(HEAVY))


@pytest.mark.parametrize("module", CORE)
def test_core_module_loads_no_heavy_dependency(module, repo_root, baseline):
    assert added_heavy(f"import {module}", repo_root, baseline) == [], f"importing {module} loads these"


def test_top_level_names(repo_root, baseline):
    import hkt_nb

    missing = [name for name in TOP_LEVEL if not hasattr(hkt_nb, name)]
    if missing:  # the architecture split (issue 8) re-exports them from hkt_nb/__init__.py
        pytest.skip(f"hkt_nb does not export {missing} yet (the core split adds them to nbs/00_index or 03_model)")
    assert added_heavy(f"from hkt_nb import {', '.join(TOP_LEVEL)}", repo_root, baseline) == []


@pytest.mark.parametrize("module", ["hkt_nb.lra.listops", "hkt_nb.lra.benchmarks"])
def test_lra_without_datasets_names_the_extra(module, repo_root):
    "Without `datasets` (a core-only install) the data modules fail to import with the extra to install."
    code = f"import sys\nsys.modules['datasets'] = None  # import datasets raises ImportError\nimport {module}"
    out = fresh_python(code, repo_root)
    assert out.returncode != 0, f"{module} imported without datasets"
    assert 'ImportError: hkt_nb.lra needs the [lra] extra: pip install "hkt_nb[lra]"' in out.stderr, out.stderr
