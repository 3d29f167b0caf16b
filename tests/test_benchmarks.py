"""Tests for hkt_nb.lra.benchmarks (chapter 4): load_benchmark on generated ListOps (always) and on the real IMDB /
CIFAR-10 copies (skipped with a reason when no data folder is available), the argument checks, and the DataLoader."""
import hashlib
import os
import subprocess
import sys
import warnings
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch

from hkt_nb.lra import benchmarks, listops
from hkt_nb.lra import benchmarks as D
from hkt_nb.lra.benchmarks import (
    batch_length,
    cache_dir,
    load_benchmark,
    load_task,
    make_dataloader,
    resolve_data_dir,
)
from hkt_nb.lra.config import TASKS, get_preset
from hkt_nb.lra.listops import LISTOPS_SETTINGS, make_listops
from hkt_nb.lra.tokenize import byte_decode, image_decode, listops_encode

PAPER = {k: LISTOPS_SETTINGS["paper"][k] for k in ("min_length", "max_length", "max_depth", "max_args")}


# ---------------------------------------------------------------- load_benchmark: ListOps (always runs)
def test_listops_splits_keep_test_whole_and_drop_collisions_from_validation_then_train(monkeypatch, tmp_path):
    "Chapter 4, *Splits*: test is kept whole (even though it is the larger split), then validation, then train."
    tiny = dict(min_length=3, max_length=5, max_depth=2, max_args=2, seq_len=8)  # length 4 only: 400 possible trees
    sizes = {"train": 60, "validation": 40, "test": 100}
    monkeypatch.setitem(LISTOPS_SETTINGS, "tiny", {**tiny, **{f"n_{s}": n for s, n in sizes.items()}})
    generator = {k: tiny[k] for k in ("min_length", "max_length", "max_depth", "max_args")}
    raw = {s: make_listops(n, **generator, seed=0, stream=k, num_proc=1)["Source"]
           for k, (s, n) in enumerate(sizes.items())}
    with pytest.warns(UserWarning, match="also occur in another split"):
        out = D.listops_splits(None, sizes=dict.fromkeys(sizes), caps=dict.fromkeys(sizes), seed=0,
                               cache_root=tmp_path, setting="tiny")
    assert out["test"]["Source"] == raw["test"]  # the larger split loses nothing
    assert out["validation"]["Source"] == [x for x in raw["validation"] if x not in set(raw["test"])]
    kept = set(raw["test"]) | set(raw["validation"])
    assert out["train"]["Source"] == [x for x in raw["train"] if x not in kept]
    assert len(out["validation"]) < sizes["validation"] and len(out["train"]) < sizes["train"]  # collisions did occur


def test_imdb_validation_size_is_the_documented_constant():
    labels = np.repeat([0, 1], 3000)
    val = D._imdb_val_indices(labels, 0)
    assert D.IMDB_VAL_PER_CLASS == 1250 and np.bincount(labels[val]).tolist() == [1250, 1250]


def test_load_benchmark_listops_small():
    dd = D.load_benchmark("listops", max_examples={"train": 40, "validation": 10, "test": 10})
    assert {k: len(v) for k, v in dd.items()} == {"train": 40, "validation": 10, "test": 10}
    assert dd["train"].column_names == ["input_ids", "label", "length"]
    # the train split is the head of stream 0 of the paper setting (prefix consistency)
    ref = make_listops(40, **PAPER, seed=0, stream=0, num_proc=1)
    assert [listops_encode(s) for s in ref["Source"]] == dd["train"]["input_ids"]
    assert dd["train"]["label"] == ref["Target"]
    assert all(n == len(x) for n, x in zip(dd["train"]["length"], dd["train"]["input_ids"]))
    srcs = [set(map(tuple, dd[s]["input_ids"])) for s in D.SPLITS]
    assert not (srcs[0] & srcs[1]) and not (srcs[0] & srcs[2]) and not (srcs[1] & srcs[2])
    # cached: a second call gives the same data
    dd2 = D.load_benchmark("listops", max_examples={"train": 40, "validation": 10, "test": 10})
    assert dd2["validation"]["input_ids"] == dd["validation"]["input_ids"]
    # a seq_len that would cut expressions is refused (the hardening tests below sweep the cases)
    with pytest.raises(ValueError, match="seq_len"):
        D.load_benchmark("listops", max_examples=5, seq_len=32)
    info = D.benchmark_info("listops")
    assert (info.vocab_size, info.n_classes, info.seq_len) == (16, 10, 512)


def test_load_benchmark_bad_input(tmp_path):
    with pytest.raises(KeyError, match="task"):
        D.load_benchmark("pathfinder")
    with pytest.raises(ValueError, match="setting"):
        D.load_benchmark("listops", setting="huge")
    with pytest.raises(ValueError, match="rgb"):  # an option of another task
        D.load_benchmark("imdb", rgb=True)
    with pytest.raises(TypeError, match="rgb"):
        D.load_benchmark("scifar10", rgb="yes")
    with pytest.raises(ValueError, match="max_examples"):
        D.load_benchmark("listops", max_examples=0)
    with pytest.raises(ValueError, match="seq_len"):
        D.load_benchmark("listops", seq_len=0, max_examples=2)
    with pytest.raises(ValueError, match="task"):
        D.load_raw("listops")  # generated: no hub data
    with pytest.raises(FileNotFoundError, match="plain_text/train-00000-of-00001.parquet"):
        D.load_benchmark("imdb", data_dir=tmp_path / "missing")
    (tmp_path / "imdb" / "plain_text").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="HKT_DATA_DIR"):
        D.load_benchmark("imdb", data_dir=tmp_path)
    for split in ("train", "test"):
        (tmp_path / "imdb" / "plain_text" / f"{split}-00000-of-00001.parquet").write_bytes(b"not parquet")
    with pytest.raises(ValueError, match="parquet"):
        D.load_benchmark("imdb", data_dir=tmp_path)


def test_bad_labels_and_empty_split(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    folder = tmp_path / "imdb" / "plain_text"
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"text": ["good", "bad"], "label": [0, 2]}), folder / "train-00000-of-00001.parquet")
    pq.write_table(pa.table({"text": ["ok"], "label": [1]}), folder / "test-00000-of-00001.parquet")
    with pytest.raises(ValueError, match="labels"):
        D.load_raw("imdb", tmp_path)
    pq.write_table(pa.table({"text": pa.array([], pa.string()), "label": pa.array([], pa.int64())}),
                   folder / "train-00000-of-00001.parquet")
    with pytest.raises(ValueError, match="empty"):
        D.load_raw("imdb", tmp_path)


# ---------------------------------------------------------------- DataLoader
def test_dataloader_padding_mask_and_determinism():
    dd = D.load_benchmark("listops", max_examples={"train": 40, "validation": 10, "test": 10})
    split = dd["train"]
    dl = D.make_dataloader(split, 8, shuffle=True, seed=3)
    batches = list(dl)
    assert len(batches) == 5
    seen = []
    for x, m, y in batches:
        assert x.dtype == torch.long and m.dtype == torch.bool and y.dtype == torch.long
        assert x.shape == m.shape and x.shape[1] >= 64 and (x.shape[1] % 64 == 0 or x.shape[1] == max(split["length"]))
        assert torch.equal(m, x == 0)                          # pad id 0 never occurs inside a sequence
        seen += [tuple(r[~mr].tolist()) for r, mr in zip(x, m)]
    assert sorted(seen) == sorted(map(tuple, split["input_ids"]))
    again = [b[0] for b in D.make_dataloader(split, 8, shuffle=True, seed=3)]
    assert all(torch.equal(a, b[0]) for a, b in zip(again, batches))
    fixed = next(iter(D.make_dataloader(split, 4, fixed_length=512)))
    assert fixed[0].shape == (4, 512)
    assert torch.equal(fixed[2], torch.tensor(split["label"][:4]))
    sampler = torch.utils.data.DistributedSampler(split, num_replicas=2, rank=1, shuffle=True, seed=0)
    n = sum(len(b[2]) for b in D.make_dataloader(split, 8, sampler=sampler))
    assert n == 20
    with pytest.raises(ValueError, match="sampler"):
        D.make_dataloader(split, 8, shuffle=True, sampler=sampler)
    with pytest.raises(ValueError, match="batch_size"):
        D.make_dataloader(split, 0)


# ---------------------------------------------------------------- real data (HKT_DATA_DIR)
def test_raw_counts_and_balance(data_dir):
    imdb = D.load_raw("imdb", data_dir)
    assert len(imdb["train"]) == 25_000 and len(imdb["test"]) == 25_000
    for s in ("train", "test"):
        assert np.bincount(imdb[s]["label"]).tolist() == [12_500, 12_500]
    assert imdb["train"].features["label"].names == ["neg", "pos"]
    cifar = D.load_raw("scifar10", data_dir)
    assert len(cifar["train"]) == 50_000 and len(cifar["test"]) == 10_000
    assert np.bincount(cifar["train"]["label"]).tolist() == [5_000] * 10
    assert np.bincount(cifar["test"]["label"]).tolist() == [1_000] * 10
    assert cifar["train"]["label"][:10] == [6, 9, 9, 4, 1, 1, 2, 7, 8, 3]   # data_batch_1 (PROVENANCE.md)


def test_imdb_benchmark(data_dir):
    dd = D.load_benchmark("imdb", data_dir=data_dir, max_examples=200)
    assert {k: len(v) for k, v in dd.items()} == {"train": 200, "validation": 200, "test": 200}
    raw = D.load_raw("imdb", data_dir)
    # the validation carve: stratified, 1250 per class, disjoint from train, deterministic in the seed
    val = D._imdb_val_indices(np.asarray(raw["train"]["label"]), 0)
    assert len(val) == 2500 and np.bincount(np.asarray(raw["train"]["label"])[val]).tolist() == [1250, 1250]
    assert np.array_equal(val, D._imdb_val_indices(np.asarray(raw["train"]["label"]), 0))
    assert not np.array_equal(val, D._imdb_val_indices(np.asarray(raw["train"]["label"]), 1))
    texts = set(raw["train"].select(val)["text"])
    for ids in dd["validation"]["input_ids"][:50]:
        assert 1 <= min(ids) and max(ids) <= 256 and len(ids) <= 1024
    decoded = [byte_decode(ids) for ids in dd["validation"]["input_ids"]]
    short = [t for t, ids in zip(decoded, dd["validation"]["input_ids"]) if len(ids) < 1024]
    assert short and all(t in texts for t in short)       # untruncated reviews decode back exactly
    labels = np.array(dd["train"]["label"])
    assert 0.35 < labels.mean() < 0.65                     # a seeded subset, not "all negative first"
    again = D.load_benchmark("imdb", data_dir=data_dir, max_examples=200)
    assert again["train"]["input_ids"] == dd["train"]["input_ids"]


def test_scifar_benchmark(data_dir):

    from PIL import Image
    dd = D.load_benchmark("scifar10", data_dir=data_dir, max_examples={"train": 64, "validation": 64, "test": 64})
    raw = D.load_raw("scifar10", data_dir)
    assert all(n == 1024 for n in dd["test"]["length"])
    order = D._split_order(10_000, 0, "test")[:64]
    img = np.asarray(raw["test"][int(order[0])]["img"].convert("RGB"))
    assert np.array_equal(image_decode(dd["test"]["input_ids"][0]), np.asarray(Image.fromarray(img).convert("L")))
    assert dd["test"]["label"][0] == raw["test"][int(order[0])]["label"]
    # validation = LRA's train[90%:]: indices 45000.. of the training file
    vorder = D._split_order(5_000, 0, "validation")[:64]
    assert dd["validation"]["label"] == [raw["train"][45_000 + int(i)]["label"] for i in vorder]
    rgb = D.load_benchmark("scifar10", data_dir=data_dir, rgb=True, max_examples=4)
    assert len(rgb["test"]["input_ids"][0]) == 3072
    assert np.array_equal(image_decode(rgb["test"]["input_ids"][0], rgb=True), img)
    assert D.benchmark_info("scifar10", rgb=True).seq_len == 3072


def test_synthetic_task_is_capped_once_and_sized_from_its_data():
    capped = D.load_task("synthetic", caps={"train": 40, "validation": None, "test": 16}, seed=3)
    full = D.synthetic_benchmark(seq_len=64, seed=3)
    assert {s: len(capped[s]) for s in D.SPLITS} == {"train": 40, "validation": 128, "test": 16}
    assert capped["train"]["input_ids"] == full["train"]["input_ids"][:40]  # a prefix of i.i.d. rows
    vocab_size, n_classes = D.task_sizes("synthetic", capped)
    assert vocab_size == max(max(row) for row in capped["train"]["input_ids"]) + 1 and n_classes == 4
    with pytest.raises(ValueError, match="dataset_dict"):
        D.task_sizes("synthetic")


def test_truncation_is_counted_by_the_pipeline():
    "The pipeline cuts every tokeniser's output to T and counts the cut rows (ListOps refuses to cut, see above)."
    batch = {"Source": ["( ( [MAX 4 ) 3 ) ] )", "7"], "Target": [4, 7]}
    out = D._tokenise_batch(batch, lambda b: {"input_ids": [listops_encode(s) for s in b["Source"]],
                                              "label": b["Target"]}, 3, {})
    assert out == {"input_ids": [[12, 5, 4], [8]], "label": [4, 7], "length": [3, 1], "cut": [True, False]}
    images = np.arange(2 * 6).reshape(2, 6)
    cut = D._tokenise_batch({}, lambda b: {"input_ids": images, "label": [0, 1]}, 4, {})
    assert cut["input_ids"].dtype == np.uint16 and cut["input_ids"].shape == (2, 4) and cut["cut"] == [True, True]


def test_parquet_damaged_in_the_middle_names_the_file_and_the_readers_error(tmp_path):
    """Issue 20, item 6: a parquet whose footer is intact but whose data pages are damaged passes the layout check;
    the error names that file and pyarrow's own error, not the layout advice (which would not apply)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    folder = tmp_path / "imdb" / "plain_text"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    texts = ["".join(rng.choice(list("abcdefgh "), 200)) for _ in range(2000)]
    for split in ("train", "test"):
        pq.write_table(pa.table({"text": texts, "label": [i % 2 for i in range(2000)]}),
                       folder / f"{split}-00000-of-00001.parquet", row_group_size=200, compression="zstd")
    damaged = folder / "train-00000-of-00001.parquet"
    data = bytearray(damaged.read_bytes())
    data[len(data) // 3: len(data) // 2] = b"\xff" * (len(data) // 2 - len(data) // 3)
    damaged.write_bytes(bytes(data))
    assert pq.read_metadata(damaged).num_rows == 2000  # the footer still reads: only the pages are damaged
    with pytest.raises(ValueError) as error:
        D.load_raw("imdb", tmp_path, cache=tmp_path / "cache")
    message = str(error.value)
    assert str(damaged) in message and "ZSTD" in message and "corrupt" in message
    assert "expected the Hugging Face parquet layout" not in message


# ---------------------------------------------------------------- hardening: batch lengths, truncation, argument types,
# user paths, prefix consistency, side effects, and the pins that keep committed runs valid
REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("HKT_DATA_DIR") or REPO.parent / "shared" / "data")
needs_data = pytest.mark.skipif(not (DATA / "imdb").is_dir(), reason="real IMDB / CIFAR-10 data not available")
QUIET = dict(device="cpu", progress=False, verbose=False)


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
#: cpu_small preset (the first CPU preset, whose committed runs the theory chapters read), and the split sizes,
#: measured with the code that produced those runs.
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
    train_config = get_preset("cpu_small").train_config(task)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dataset_dict = load_task(task, DATA, caps=train_config.caps(), seed=train_config.data_seed,
                                 options=train_config.task_options)
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
