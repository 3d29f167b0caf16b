"""The data side of the hardening issue for hkt_nb.lra (benchmarks, listops, tokenize): batch lengths, truncation,
argument types, user paths, prefix consistency, side effects, and the pins that keep committed runs valid. The
loop's, config's and runs' tests moved to test_loop, test_checkpoints, test_distributed, test_config, test_runs,
test_records and test_workspace; these belong in the data modules' own test files."""
import hashlib
import os
import subprocess
import sys
import warnings
from pathlib import Path

import datasets
import numpy as np
import pytest

from hkt_nb.lra import benchmarks, listops
from hkt_nb.lra.benchmarks import (
    batch_length,
    cache_dir,
    load_benchmark,
    load_task,
    make_dataloader,
    resolve_data_dir,
)
from hkt_nb.lra.config import TASKS, get_preset

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("HKT_DATA_DIR") or REPO.parent / "shared" / "data")
needs_data = pytest.mark.skipif(not (DATA / "imdb").is_dir(), reason="real IMDB / CIFAR-10 data not available")
QUIET = dict(device="cpu", progress=False, verbose=False)


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HKT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


# ---------------------------------------------------------------- 1. batches never exceed the sequence length
@pytest.mark.parametrize("seq_len", [64, 100, 500, 512, 1000, 1024, 2000, 3072])
def test_batch_length_never_exceeds_max_length(seq_len):
    for longest in sorted({1, seq_len // 3, seq_len - 14, seq_len - 1, seq_len}):
        length = batch_length(longest, 64, seq_len)
        assert longest <= length <= seq_len
        assert length == min(-(-longest // 64) * 64, seq_len)


def test_dataloader_caps_a_1986_token_batch_at_2000():
    "The quoted case: ListOps in LRA's setting (T 2000), a batch holding a 1,986-token expression."
    split = datasets.Dataset.from_dict({"input_ids": [[1] * 1986, [2] * 30], "label": [0, 1]})
    assert next(iter(make_dataloader(split, 2, max_length=2000)))[0].shape == (2, 2000)
    assert next(iter(make_dataloader(split, 2)))[0].shape == (2, 1986)  # default: the split's longest
    assert next(iter(make_dataloader(split.select([1]), 1)))[0].shape == (1, 30)


@needs_data
@pytest.mark.parametrize("task, seq_len", [("imdb", 1000), ("imdb", 700), ("scifar10", 1000), ("listops", 600)])
def test_real_batches_fit_every_task_and_seq_len(task, seq_len, tmp_cache):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        split = load_benchmark(task, seq_len=seq_len, max_examples=48, data_dir=DATA)["train"]
    for input_ids, _, _ in make_dataloader(split, 16):
        assert input_ids.shape[1] <= seq_len


# ---------------------------------------------------------------- 2. truncation: refuse for ListOps, warn otherwise
@pytest.mark.parametrize("setting, seq_len", [("paper", 256), ("paper", 511), ("lra", 512), ("lra", 1998)])
def test_listops_refuses_a_seq_len_that_cuts_expressions(setting, seq_len, tmp_cache):
    with pytest.raises(ValueError, match=f"seq_len={seq_len}"):
        load_benchmark("listops", setting=setting, seq_len=seq_len, max_examples=2)


@needs_data
def test_text_and_images_warn_with_the_fraction_truncated(tmp_cache):
    with pytest.warns(UserWarning, match=r"imdb: \d+\.\d % of the reviews .* seq_len=256"):
        load_benchmark("imdb", seq_len=256, max_examples=20, data_dir=DATA)
    with pytest.warns(UserWarning, match=r"scifar10: 100\.0 % of the images"):
        load_benchmark("scifar10", seq_len=512, max_examples=4, data_dir=DATA)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_benchmark("scifar10", max_examples=4, data_dir=DATA)  # full images: nothing cut, no warning


# ---------------------------------------------------------------- 6. types, before any work
@pytest.mark.parametrize("argument, value, error", [
    ("seq_len", "512", TypeError), ("seq_len", 512.0, TypeError), ("seq_len", True, TypeError),
    ("seq_len", 0, ValueError), ("n_train", "10", TypeError), ("n_test", -1, ValueError),
    ("max_examples", 2.5, TypeError), ("max_examples", {"train": "3"}, TypeError)])
@pytest.mark.parametrize("task", TASKS)
def test_load_benchmark_argument_types(task, argument, value, error, tmp_cache):
    with pytest.raises(error, match=argument):
        load_benchmark(task, **{argument: value})


# ---------------------------------------------------------------- 10. paths relative to where the user stood
@pytest.mark.parametrize("variable, resolve", [("HKT_DATA_DIR", resolve_data_dir), ("HKT_CACHE_DIR", cache_dir)])
def test_environment_paths_resolve_against_the_users_directory(tmp_path, monkeypatch, variable, resolve):
    user_dir, notebook_dir = tmp_path / "repo", tmp_path / "repo" / "nbs"
    notebook_dir.mkdir(parents=True)
    monkeypatch.setenv("PWD", str(user_dir))
    monkeypatch.chdir(notebook_dir)  # a notebook runner moves the kernel into nbs/
    monkeypatch.setenv(variable, "data")
    assert resolve() == user_dir / "data"


def test_argument_paths_resolve_against_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PWD", "/")
    assert resolve_data_dir("data") == tmp_path / "data" and cache_dir("c") == tmp_path / "c"


# ---------------------------------------------------------------- 13. prefix consistency in every setting
@pytest.mark.parametrize("window", [
    dict(min_length=3, max_length=5, max_depth=2, max_args=2),    # 400 possible trees: many duplicates
    dict(min_length=2, max_length=6, max_depth=2, max_args=3),
    dict(min_length=4, max_length=12, max_depth=3, max_args=3)])
@pytest.mark.parametrize("chunk_size", [7, 50])
def test_make_listops_is_prefix_consistent_with_duplicates(window, chunk_size):
    longest = listops.make_listops(160, **window, chunk_size=chunk_size, num_proc=1)["Source"]
    for n in (1, 13, 81, 159):
        assert listops.make_listops(n, **window, chunk_size=chunk_size, num_proc=1)["Source"] == longest[:n]
    assert len(set(longest)) == len(longest)


# ---------------------------------------------------------------- 14. no side effects, no machine paths
def test_importing_the_lra_modules_changes_no_global_state():
    "Our modules change no warnings filter (torch, datasets and tqdm install their own: imported first)."
    code = ("import warnings, torch, torch.distributed, datasets, numpy, tqdm, pyarrow, PIL.Image, hkt_nb.model; "
            "before = list(warnings.filters); import hkt_nb.lra.runs, hkt_nb.lra.benchmarks, hkt_nb.lra.tokenize; "
            "assert warnings.filters == before, 'warnings filters changed on import'")
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)


# ---------------------------------------------------------------- pins: committed runs stay valid
#: sha256 (first 16 hex digits) of the first 64 rows (token ids as uint16, then the label) of every split of the
#: cpu preset, and the split sizes, measured with the code that produced the committed runs.
CPU_PRESET_PINS = {
    "listops/train": (6000, "ba9909ce966d6026"), "listops/validation": (1000, "bc4f1ba92ffacf7d"),
    "listops/test": (2000, "65d6f136d8320837"), "imdb/train": (2500, "51952290665c4738"),
    "imdb/validation": (1000, "12e2591628315373"), "imdb/test": (2000, "b4d5b04034240a7e"),
    "scifar10/train": (2500, "b0240746c565061d"), "scifar10/validation": (1000, "aa4a2cfe2542984f"),
    "scifar10/test": (2000, "085b96dd24e19fb3")}


@needs_data
@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS)
def test_cpu_preset_splits_are_byte_identical(task):
    "Uses the shared cache when set (as the runs do); a fresh cache regenerates and must give the same bytes."
    train_config = get_preset("cpu").train_config(task)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dataset_dict = load_task(task, DATA, caps=train_config.caps(), seed=train_config.data_seed)
    for split in ("train", "validation", "test"):
        digest = hashlib.sha256()
        for row in dataset_dict[split].select(range(64)):
            digest.update(np.asarray(row["input_ids"], np.uint16).tobytes()); digest.update(str(row["label"]).encode())
        assert (len(dataset_dict[split]), digest.hexdigest()[:16]) == CPU_PRESET_PINS[f"{task}/{split}"]


def test_cpu_listops_generation_is_pinned():
    "The generator itself (no cache): the first rows of the cpu preset's ListOps test stream."
    params = {k: listops.LISTOPS_SETTINGS["paper"][k] for k in ("min_length", "max_length", "max_depth", "max_args")}
    rows = listops.make_listops(64, **params, seed=0, stream=2, num_proc=1)
    tokens = benchmarks._tok_listops({"Source": rows["Source"], "Target": rows["Target"]}, 512)
    digest = hashlib.sha256()
    for ids, label in zip(tokens["input_ids"], tokens["label"]):
        digest.update(np.asarray(ids, np.uint16).tobytes()); digest.update(str(label).encode())
    assert digest.hexdigest()[:16] == CPU_PRESET_PINS["listops/test"][1]


@pytest.mark.parametrize("argument", ["n_examples", "min_length", "max_length", "max_depth", "max_args"])
def test_make_listops_names_a_non_integer_argument(argument):
    arguments = dict(n_examples=3, min_length=3, max_length=9, max_depth=3, max_args=3)
    arguments[argument] = str(arguments[argument])
    with pytest.raises(TypeError, match=argument):
        listops.make_listops(arguments.pop("n_examples"), **arguments, num_proc=1)
