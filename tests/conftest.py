"""The one fixture set of the test suite (issue 8): every test module takes its fixtures from here.

- `repo_root`: the repository root (a `Path`).
- `data_dir`: the real IMDB / CIFAR-10 copies (`HKT_DATA_DIR`, else `../shared/data` beside the checkout);
  the test is skipped with a reason when there is none.
- `settings`: the `[DEFAULT]` section of settings.ini (version, repository address, extras).
- `build_book`: scripts/build_book.py, imported as the module `build_book`.
- `padded_batch`, `randomise`: factories of a right-padded float64 batch and of random layer parameters.
- `graph_breaks`: `graph_breaks(module, *args)` -> (count, reasons) of `torch._dynamo.explain`.
- `randomised_mha`: factory of a float64 `nn.MultiheadAttention` (batch_first) with every parameter random.
- `one_thread`: one torch thread for the test (deterministic, not slowed by other jobs on a 2-core machine).
- `attention_registry`: `hkt_nb.model.ATTENTION_VARIANTS`, restored after the test (for tests that register a variant).
- `committed_records`: the results records committed under results/ (`(path, record)` pairs with a model config).
- autouse: torch seeded with 0 before every test; every cache (`HKT_CACHE_DIR`) in one temporary folder per
  session, never the user's cache.
Markers (registered in pyproject.toml): `slow` (> ~10 s; CI runs them, `-m "not slow"` skips them locally)
and `cuda` (skipped without a CUDA GPU).
"""
import configparser
import dataclasses
import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("MPLBACKEND", "Agg")

REPO_ROOT = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available() or os.environ.get("HKT_TEST_DEVICE") == "cpu":  # the GPU check's CPU dry run
        return
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(no_gpu)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def settings() -> configparser.SectionProxy:
    "The `[DEFAULT]` section of settings.ini, where the version, the repository address and the extras are written."
    parser = configparser.ConfigParser(delimiters=["="])
    parser.read(REPO_ROOT / "settings.ini", encoding="utf-8")
    return parser["DEFAULT"]


@pytest.fixture(scope="session")
def build_book():
    "scripts/build_book.py (the book build), imported as the module `build_book`."
    spec = importlib.util.spec_from_file_location("build_book", REPO_ROOT / "scripts" / "build_book.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("build_book", module)
    spec.loader.exec_module(module)
    return module


def find_data_dir() -> Path | None:
    "The folder of the real datasets: `HKT_DATA_DIR`, else `../shared/data` beside this checkout, else None."
    configured = os.environ.get("HKT_DATA_DIR")
    if configured:
        return Path(configured).resolve()
    local = REPO_ROOT.parent / "shared" / "data"
    return local if (local / "imdb").is_dir() else None


@pytest.fixture(scope="session")
def data_dir() -> Path:
    found = find_data_dir()
    if found is None:
        pytest.skip("real IMDB / CIFAR-10 data not available: set HKT_DATA_DIR to a folder with imdb/ and cifar10/ "
                    "in the hub's parquet layout")
    return found


@pytest.fixture
def one_thread():
    "One torch thread: deterministic and not slowed down by other jobs on a shared 2-core machine."
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    "All caches go to one temporary folder per test session (never the user's cache)."
    monkeypatch.setenv("HKT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "hkt_cache"))


def _padded_batch(B=3, T=13, D=16, lengths=(13, 9, 2), dtype=torch.float64):
    "A right-padded batch: x (B, T, D) and key_padding_mask (B, T), True = padding; T = 13 is no multiple of 4."
    x = torch.randn(B, T, D, dtype=dtype)
    return x, torch.arange(T)[None] >= torch.tensor(lengths)[:, None]


def _randomise(module, std=0.3):
    "Non-trivial values in every parameter (biases, fusion logits, gates), so that no term is accidentally zero."
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, std)
    return module


@pytest.fixture
def padded_batch():
    "Factory fixture: `padded_batch(B=3, T=13, D=16, lengths=(13, 9, 2), dtype=float64)` -> (x, key_padding_mask)."
    return _padded_batch


@pytest.fixture
def randomise():
    "Factory fixture: `randomise(module, std=0.3)` fills every parameter with N(0, std^2) and returns the module."
    return _randomise


@pytest.fixture
def attention_registry():
    "`ATTENTION_VARIANTS`, restored to its entries after the test: a test may register its own variant."
    from hkt_nb.model import ATTENTION_VARIANTS
    saved = dict(ATTENTION_VARIANTS)
    yield ATTENTION_VARIANTS
    ATTENTION_VARIANTS.clear()
    ATTENTION_VARIANTS.update(saved)


@pytest.fixture(scope="session")
def committed_records() -> list:
    "Every committed results record (results/*.json) that holds a model config, as (path, record) pairs."
    import json
    records = [(p, json.loads(p.read_text())) for p in sorted((REPO_ROOT / "results").glob("*.json"))]
    return [(p, r) for p, r in records if "model" in r.get("config", {})]


@pytest.fixture
def randomised_mha():
    "Factory: `randomised_mha(bias=True, dropout=0.0, D=16, H=4)`, a float64 MHA with every parameter N(0, 0.3^2)."
    def make(bias=True, dropout=0.0, D=16, H=4):  # biases too, so no term of the twin is accidentally zero
        return _randomise(torch.nn.MultiheadAttention(D, H, bias=bias, dropout=dropout, batch_first=True).double())
    return make


@pytest.fixture
def graph_breaks():
    "`graph_breaks(module, *args)`: the number of graph breaks `torch.compile` makes on that call, and their reasons."
    import torch._dynamo as dynamo

    def count(module, *args):
        dynamo.reset()
        explanation = dynamo.explain(module)(*args)
        return explanation.graph_break_count, [str(b.reason)[:120] for b in explanation.break_reasons]
    return count


@pytest.fixture
def temporary_arm():
    "Register experiment arms (`hkt_nb.lra.config.register_arm`) for one test; they are removed afterwards."
    from hkt_nb.lra.config import ARMS, register_arm
    added = []

    def register(arm):
        added.append(arm.name)
        return register_arm(arm)
    yield register
    for name in added:
        ARMS.pop(name, None)


@pytest.fixture
def temporary_variant():
    """Register attention variants (`hkt_nb.model.register_attention`) for one test: `register(name, internals=...)`
    registers an MHA-like variant without parameters; they are removed afterwards."""
    from hkt_nb.model import ATTENTION_VARIANTS, MultiHeadAttention, register_attention

    @dataclasses.dataclass(frozen=True)
    class NoParams:
        pass
    added = []

    def register(name, internals=None):
        added.append(name)
        return register_attention(name, lambda d, h, causal, dropout, p: MultiHeadAttention(d, h, causal, dropout),
                                  NoParams, internals)
    yield register
    for name in added:
        ATTENTION_VARIANTS.pop(name, None)


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """One complete smoke run of the synthetic task on one CPU thread, saving its best model (a variant of `smoke`:
    save_model is result-relevant): `(folder, record)`; results in `folder/results`, checkpoints in `folder/ckpt`."""
    from hkt_nb.lra.loop import train
    d = tmp_path_factory.mktemp("smoke")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        r = train("synthetic", "hkt", "smoke", 0, device="cpu", results_dir=d / "results",
                  checkpoint_dir=d / "ckpt", progress=False, verbose=False, train_overrides={"save_model": True})
    finally:
        torch.set_num_threads(n)
    return d, r


@pytest.fixture
def committed_record():
    "The committed record results/listops-hkt-cpu_small-seed0.json (skips when it is not there)."
    import json
    path = REPO_ROOT / "results" / "listops-hkt-cpu_small-seed0.json"
    if not path.is_file():
        pytest.skip("no committed cpu_small run")
    return json.loads(path.read_text())


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    "A fresh cache folder for the data pipeline (`HKT_CACHE_DIR`) for one test."
    monkeypatch.setenv("HKT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"
