"""Tests for hkt_nb.lra.listops, .tokenize and .benchmarks: the ListOps generator (checked by an independent evaluator written here), the
tokenisers, load_benchmark on the real IMDB / CIFAR-10 copies (skipped with a reason when no data folder is
available) and the DataLoader."""
import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hkt_nb.lra import benchmarks, listops, tokenize

# one namespace over the three data modules of chapter 4 (names are unique across them)
D = SimpleNamespace(**{**vars(listops), **vars(tokenize), **vars(benchmarks)})

REPO = Path(__file__).resolve().parents[1]
PAPER = {k: D.LISTOPS_SETTINGS["paper"][k] for k in ("min_length", "max_length", "max_depth", "max_args")}


# ---------------------------------------------------------------- an independent ListOps evaluator
def independent_eval(source: str) -> int:
    """Evaluate an LRA Source string with an explicit operand stack (no recursion, no shared code with
    hkt_nb.lra). Parentheses are ignored. MED: median of the sorted list, the two middle values averaged and
    floored for an even count (all values are >= 0, so floor = LRA's int() truncation)."""
    frames = []  # each frame: [operator, list of argument values]
    result = None
    for tok in source.replace("(", " ").replace(")", " ").split():
        if tok.startswith("["):
            frames.append([tok[1:], []])
        elif tok == "]":
            op, args = frames.pop()
            s = sorted(args)
            n = len(s)
            if op == "MIN":
                v = s[0]
            elif op == "MAX":
                v = s[-1]
            elif op == "SM":
                v = sum(s) % 10
            elif op == "MED":
                v = s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) // 2
            else:
                raise AssertionError(op)
            if frames:
                frames[-1][1].append(v)
            else:
                result = v
        else:
            v = int(tok)
            if frames:
                frames[-1][1].append(v)
            else:
                result = v
    assert not frames
    return result


def test_independent_evaluator_known_answers():
    assert independent_eval("[MAX 4 3 [MIN 2 3 ] 1 0 [MED 1 5 8 9 2 ] ]") == 5
    assert independent_eval("[SM 9 9 5 ]") == 3
    assert independent_eval("[MED 1 2 ]") == 1          # (1+2)/2 = 1.5 -> int 1
    assert independent_eval("[MED 3 4 8 9 ]") == 6      # (4+8)/2
    assert independent_eval("( ( ( [MAX 4 ) 3 ) ] )") == 4
    # the library agrees on the same strings
    for s in ["[MAX 4 3 [MIN 2 3 ] 1 0 [MED 1 5 8 9 2 ] ]", "[SM 9 9 5 ]", "[MED 1 2 ]", "[MED 3 4 8 9 ]"]:
        assert D.listops_value(D.parse_listops(s)) == independent_eval(s)


def test_lra_string_format():
    tree = ("[MAX", [4, 3, ("[MIN", [2, 3])])
    assert D.tree_to_source(tree) == "( ( ( ( [MAX 4 ) 3 ) ( ( ( [MIN 2 ) 3 ) ] ) ) ] )"
    assert D.tree_to_source(tree, parens=False) == "[MAX 4 3 [MIN 2 3 ] ]"
    assert D.parse_listops(D.tree_to_source(tree)) == tree
    assert D.tree_depth(tree) == 2 and D.tree_depth(7) == 0


@pytest.fixture(scope="module")
def sample():
    return D.make_listops(300, **PAPER, seed=11, with_stats=True, num_proc=1)


def test_generator_targets_match_independent_evaluator(sample):
    for src, tgt in zip(sample["Source"], sample["Target"]):
        assert independent_eval(src) == tgt


def test_generator_lengths_depths_and_uniqueness(sample):
    lens = np.array(sample["length"])
    assert lens.min() > PAPER["min_length"] and lens.max() < PAPER["max_length"]
    for src, n, depth in zip(sample["Source"], lens, sample["depth"]):
        toks = src.replace("(", " ").replace(")", " ").split()
        assert len(toks) == n == len(D.listops_encode(src))
        assert toks.count("]") == sum(t.startswith("[") for t in toks)
        # operator nesting from the bracket counts alone
        level = deepest = 0
        for t in toks:
            level += t.startswith("[") - (t == "]")
            deepest = max(deepest, level)
        assert deepest == depth <= PAPER["max_depth"] - 1
    assert len(set(sample["Source"])) == len(sample)
    assert set(np.unique(sample["Target"])) <= set(range(10))


def test_generator_argument_counts(sample):
    for src in sample["Source"][:50]:
        counts = []
        for tok in src.replace("(", " ").replace(")", " ").split():
            if tok.startswith("["):
                counts.append(0)
            elif tok == "]":
                k = counts.pop()
                assert 2 <= k <= PAPER["max_args"]
                if counts: counts[-1] += 1
            elif counts:
                counts[-1] += 1


def test_generator_deterministic_prefix_consistent_and_process_independent(sample):
    again = D.make_listops(120, **PAPER, seed=11, num_proc=2, chunk_size=50)
    one = D.make_listops(120, **PAPER, seed=11, num_proc=1, chunk_size=50)
    assert again["Source"] == one["Source"]
    short = D.make_listops(40, **PAPER, seed=11, num_proc=1, chunk_size=50)
    assert short["Source"] == one["Source"][:40]
    assert D.make_listops(120, **PAPER, seed=11, num_proc=1)["Source"] == sample["Source"][:120]
    other = D.make_listops(40, **PAPER, seed=12, num_proc=1)
    assert other["Source"] != short["Source"]


def test_generate_tree_uses_lra_random_stream():
    """Replays LRA's call order with a hand-written draw and checks the first tree matches."""
    rng, ref = random.Random(5), random.Random(5)

    def draw(depth, max_depth=10, max_args=10):
        r = ref.random() if depth < max_depth else 1
        if r > 0.25:
            return ref.choice(range(10))
        k = ref.randint(2, max_args)
        kids = [draw(depth + 1) for _ in range(k)]
        return (ref.choice(["[MIN", "[MAX", "[MED", "[SM"]), kids)

    for _ in range(50):
        t, n = D.generate_tree(rng)
        assert t == draw(1)
        assert n == len(D.tree_to_source(t, parens=False).split())


def test_lra_setting_sample():
    lra = {k: D.LISTOPS_SETTINGS["lra"][k] for k in ("min_length", "max_length", "max_depth", "max_args")}
    ds = D.make_listops(20, **lra, seed=0, with_stats=True, num_proc=1)
    assert min(ds["length"]) > 500 and max(ds["length"]) < 2000
    assert [independent_eval(s) for s in ds["Source"]] == ds["Target"]


def test_tsv_round_trip(tmp_path, sample):
    p = D.write_listops_tsv(sample, tmp_path / "basic_train.tsv")
    assert p.read_text().splitlines()[0] == "Source\tTarget"
    back = D.read_listops_tsv(p)
    assert back["Source"] == sample["Source"] and back["Target"] == sample["Target"]
    assert D.read_listops_tsv(p, n=5)["Source"] == sample["Source"][:5]
    bad = tmp_path / "bad.tsv"
    bad.write_text("Source\tTarget\n[MAX 1 2 ]\t12\n")
    with pytest.raises(ValueError, match="0..9"):
        D.read_listops_tsv(bad)
    with pytest.raises(FileNotFoundError):
        D.read_listops_tsv(tmp_path / "nope.tsv")


def test_listops_vocab_and_round_trip(sample):
    assert len(D.LISTOPS_VOCAB) == 16 and D.LISTOPS_VOCAB[0] == "<pad>"
    assert D.listops_encode("( ( [MAX 0 ) 9 ) ] )") == [12, 1, 10, 15]
    for src in sample["Source"][:50]:
        ids = D.listops_encode(src)
        assert 1 <= min(ids) and max(ids) <= 15
        plain = D.tree_to_source(D.parse_listops(src), parens=False)
        assert D.listops_decode(ids) == plain
        assert D.listops_encode(D.listops_decode(ids)) == ids
    with pytest.raises(ValueError, match="unknown ListOps token"):
        D.listops_encode("[FOO 1 2 ]")


def test_bad_generator_params():
    with pytest.raises(ValueError):
        D.make_listops(5, min_length=10, max_length=11)
    with pytest.raises(ValueError):
        D.make_listops(5, min_length=1, max_length=50, max_args=1)


# ---------------------------------------------------------------- load_benchmark: ListOps (always runs)
def test_load_benchmark_listops_small():
    dd = D.load_benchmark("listops", max_examples={"train": 40, "validation": 10, "test": 10})
    assert {k: len(v) for k, v in dd.items()} == {"train": 40, "validation": 10, "test": 10}
    assert dd["train"].column_names == ["input_ids", "label", "length"]
    # the train split is the head of stream 0 of the paper setting (prefix consistency)
    ref = D.make_listops(40, **PAPER, seed=0, stream=0, num_proc=1)
    assert [D.listops_encode(s) for s in ref["Source"]] == dd["train"]["input_ids"]
    assert dd["train"]["label"] == ref["Target"]
    assert all(n == len(x) for n, x in zip(dd["train"]["length"], dd["train"]["input_ids"]))
    srcs = [set(map(tuple, dd[s]["input_ids"])) for s in D.SPLITS]
    assert not (srcs[0] & srcs[1]) and not (srcs[0] & srcs[2]) and not (srcs[1] & srcs[2])
    # cached: a second call gives the same data
    dd2 = D.load_benchmark("listops", max_examples={"train": 40, "validation": 10, "test": 10})
    assert dd2["validation"]["input_ids"] == dd["validation"]["input_ids"]
    # a seq_len that would cut expressions is refused (tests/test_lra_hardening.py sweeps the cases)
    with pytest.raises(ValueError, match="seq_len=32"):
        D.load_benchmark("listops", max_examples=5, seq_len=32)
    info = D.benchmark_info("listops")
    assert (info.vocab_size, info.n_classes, info.seq_len) == (16, 10, 512)


def test_load_benchmark_bad_input(tmp_path):
    with pytest.raises(ValueError, match="unknown task"):
        D.load_benchmark("pathfinder")
    with pytest.raises(ValueError, match="setting"):
        D.load_benchmark("listops", setting="huge")
    with pytest.raises(ValueError):
        D.load_benchmark("listops", max_examples=0)
    with pytest.raises(ValueError):
        D.load_benchmark("listops", seq_len=0, max_examples=2)
    with pytest.raises(FileNotFoundError, match="plain_text/train-00000-of-00001.parquet"):
        D.load_benchmark("imdb", data_dir=tmp_path / "missing")
    (tmp_path / "imdb" / "plain_text").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="HKT_DATA_DIR"):
        D.load_benchmark("imdb", data_dir=tmp_path)
    for split in ("train", "test"):
        (tmp_path / "imdb" / "plain_text" / f"{split}-00000-of-00001.parquet").write_bytes(b"not parquet")
    with pytest.raises(ValueError, match="corrupt"):
        D.load_benchmark("imdb", data_dir=tmp_path)


def test_bad_labels_and_empty_split(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    folder = tmp_path / "imdb" / "plain_text"
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"text": ["good", "bad"], "label": [0, 2]}), folder / "train-00000-of-00001.parquet")
    pq.write_table(pa.table({"text": ["ok"], "label": [1]}), folder / "test-00000-of-00001.parquet")
    with pytest.raises(ValueError, match="labels must be in 0..1"):
        D.load_raw("imdb", tmp_path)
    pq.write_table(pa.table({"text": pa.array([], pa.string()), "label": pa.array([], pa.int64())}),
                   folder / "train-00000-of-00001.parquet")
    with pytest.raises(ValueError, match="empty"):
        D.load_raw("imdb", tmp_path)


# ---------------------------------------------------------------- tokenisers
def test_byte_round_trip():
    text = "Bromwell High is a cartoon comedy. Ünïcödé ✓"
    ids = D.byte_encode(text)
    assert len(ids) == len(text.encode()) and min(ids) >= 1 and max(ids) <= 256
    assert D.byte_decode(ids) == text
    assert D.byte_decode(ids + [0, 0, 0]) == text
    assert D.byte_encode("abc", 2) == [ord("a") + 1, ord("b") + 1]
    assert D.byte_decode(D.byte_encode("é", 1)) == "\ufffd"   # a cut multi-byte character


def test_image_tokens_match_pil():
    from PIL import Image
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
    gray = np.stack([np.asarray(Image.fromarray(im).convert("L")) for im in img])
    assert np.array_equal(D.rgb_to_gray(img), gray)
    ids = D.image_encode(img)
    assert ids.shape == (4, 1024) and ids.min() >= 1 and ids.max() <= 256
    assert np.array_equal(ids[:, 33] - 1, gray[:, 1, 1])                 # row-major
    assert np.array_equal(D.image_decode(ids), gray)
    rgb = D.image_encode(img, rgb=True)
    assert rgb.shape == (4, 3072) and np.array_equal(rgb[:, 3:6] - 1, img[:, 0, 1, :])   # R,G,B interleaved
    assert np.array_equal(D.image_decode(rgb, rgb=True), img)


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
    with pytest.raises(ValueError):
        D.make_dataloader(split, 8, shuffle=True, sampler=sampler)


# ---------------------------------------------------------------- real data (HKT_DATA_DIR)
def test_raw_counts_and_balance(data_dir):
    imdb = D.load_raw("imdb", data_dir)
    assert len(imdb["train"]) == 25_000 and len(imdb["test"]) == 25_000
    for s in ("train", "test"):
        assert np.bincount(imdb[s]["label"]).tolist() == [12_500, 12_500]
    assert imdb["train"].features["label"].names == ["neg", "pos"]
    cifar = D.load_raw("cifar10", data_dir)
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
    decoded = [D.byte_decode(ids) for ids in dd["validation"]["input_ids"]]
    short = [t for t, ids in zip(decoded, dd["validation"]["input_ids"]) if len(ids) < 1024]
    assert short and all(t in texts for t in short)       # untruncated reviews decode back exactly
    labels = np.array(dd["train"]["label"])
    assert 0.35 < labels.mean() < 0.65                     # a seeded subset, not "all negative first"
    again = D.load_benchmark("imdb", data_dir=data_dir, max_examples=200)
    assert again["train"]["input_ids"] == dd["train"]["input_ids"]


def test_scifar_benchmark(data_dir):

    from PIL import Image
    dd = D.load_benchmark("scifar10", data_dir=data_dir, max_examples={"train": 64, "validation": 64, "test": 64})
    raw = D.load_raw("cifar10", data_dir)
    assert all(n == 1024 for n in dd["test"]["length"])
    order = D._split_order(10_000, 0, "test")[:64]
    img = np.asarray(raw["test"][int(order[0])]["img"].convert("RGB"))
    assert np.array_equal(D.image_decode(dd["test"]["input_ids"][0]), np.asarray(Image.fromarray(img).convert("L")))
    assert dd["test"]["label"][0] == raw["test"][int(order[0])]["label"]
    # validation = LRA's train[90%:]: indices 45000.. of the training file
    vorder = D._split_order(5_000, 0, "validation")[:64]
    assert dd["validation"]["label"] == [raw["train"][45_000 + int(i)]["label"] for i in vorder]
    rgb = D.load_benchmark("scifar10", data_dir=data_dir, rgb=True, max_examples=4)
    assert len(rgb["test"]["input_ids"][0]) == 3072
    assert np.array_equal(D.image_decode(rgb["test"]["input_ids"][0], rgb=True), img)
    assert D.benchmark_info("scifar10", rgb=True).seq_len == 3072
