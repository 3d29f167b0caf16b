"""Tests for hkt_nb.lra.benchmarks (chapter 4): load_benchmark on generated ListOps (always) and on the real IMDB /
CIFAR-10 copies (skipped with a reason when no data folder is available), the argument checks, and the DataLoader."""
import warnings

import numpy as np
import pytest
import torch

from hkt_nb.lra import benchmarks as D
from hkt_nb.lra.listops import LISTOPS_SETTINGS, make_listops
from hkt_nb.lra.tokenize import byte_decode, image_decode, listops_encode

PAPER = {k: LISTOPS_SETTINGS["paper"][k] for k in ("min_length", "max_length", "max_depth", "max_args")}


# ---------------------------------------------------------------- load_benchmark: ListOps (always runs)
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
    # a seq_len that would cut expressions is refused (tests/test_lra_hardening.py sweeps the cases)
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
