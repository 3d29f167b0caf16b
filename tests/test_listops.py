"""Tests for hkt_nb.lra.listops (chapter 4, *ListOps generator*): the generator checked against an independent
evaluator written here, LRA's random stream and string format, determinism and prefix consistency, the TSV files."""
import functools
import random

import numpy as np
import pytest

from hkt_nb.lra import listops as D
from hkt_nb.lra.tokenize import listops_encode

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


@functools.cache
def paper_sample():
    "300 examples of the paper setting, seed 11 (generated once per session; not a fixture: fixtures live in conftest.py)."
    return D.make_listops(300, **PAPER, seed=11, with_stats=True, num_proc=1)


def test_generator_targets_match_independent_evaluator():
    sample = paper_sample()
    for src, tgt in zip(sample["Source"], sample["Target"]):
        assert independent_eval(src) == tgt


def test_generator_lengths_depths_and_uniqueness():
    sample = paper_sample()
    lens = np.array(sample["length"])
    assert lens.min() > PAPER["min_length"] and lens.max() < PAPER["max_length"]
    for src, n, depth in zip(sample["Source"], lens, sample["depth"]):
        toks = src.replace("(", " ").replace(")", " ").split()
        assert len(toks) == n == len(listops_encode(src))
        assert toks.count("]") == sum(t.startswith("[") for t in toks)
        # operator nesting from the bracket counts alone
        level = deepest = 0
        for t in toks:
            level += t.startswith("[") - (t == "]")
            deepest = max(deepest, level)
        assert deepest == depth <= PAPER["max_depth"] - 1
    assert len(set(sample["Source"])) == len(sample)
    assert set(np.unique(sample["Target"])) <= set(range(10))


def test_generator_argument_counts():
    sample = paper_sample()
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


def test_generator_deterministic_prefix_consistent_and_process_independent():
    sample = paper_sample()
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


def test_tsv_round_trip(tmp_path):
    sample = paper_sample()
    p = D.write_listops_tsv(sample, tmp_path / "basic_train.tsv")
    assert p.read_text().splitlines()[0] == "Source\tTarget"
    back = D.read_listops_tsv(p)
    assert back["Source"] == sample["Source"] and back["Target"] == sample["Target"]
    assert D.read_listops_tsv(p, n=5)["Source"] == sample["Source"][:5]
    bad = tmp_path / "bad.tsv"
    bad.write_text("Source\tTarget\n[MAX 1 2 ]\t12\n")
    with pytest.raises(ValueError, match="Target"):
        D.read_listops_tsv(bad)
    with pytest.raises(FileNotFoundError, match="nope.tsv"):
        D.read_listops_tsv(tmp_path / "nope.tsv")


def test_bad_generator_params():
    with pytest.raises(ValueError, match="min_length"):
        D.make_listops(5, min_length=10, max_length=11)
    with pytest.raises(ValueError, match="max_args"):
        D.make_listops(5, min_length=1, max_length=50, max_args=1)
    with pytest.raises(TypeError, match="n_examples"):
        D.make_listops(5.0, min_length=1, max_length=50)
