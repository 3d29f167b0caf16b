"""Tests for hkt_nb.lra.tokenize (chapter 4, *Tokenisers*): ListOps symbols, UTF-8 bytes and pixels round-trip,
grayscale equals PIL's, and the batch tokenisers that the task registry names."""
import io

import numpy as np
import pytest

from hkt_nb.lra import tokenize as D
from hkt_nb.lra.listops import LISTOPS_SETTINGS, make_listops, parse_listops, tree_to_source

PAPER = {k: LISTOPS_SETTINGS["paper"][k] for k in ("min_length", "max_length", "max_depth", "max_args")}


def test_listops_vocab_and_round_trip():
    sample = make_listops(50, **PAPER, seed=11, num_proc=1)
    assert len(D.LISTOPS_VOCAB) == 16 and D.LISTOPS_VOCAB[0] == "<pad>"
    assert D.listops_encode("( ( [MAX 0 ) 9 ) ] )") == [12, 1, 10, 15]
    for src in sample["Source"][:50]:
        ids = D.listops_encode(src)
        assert 1 <= min(ids) and max(ids) <= 15
        plain = tree_to_source(parse_listops(src), parens=False)
        assert D.listops_decode(ids) == plain
        assert D.listops_encode(D.listops_decode(ids)) == ids
    with pytest.raises(ValueError, match="FOO"):
        D.listops_encode("[FOO 1 2 ]")


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


def test_batch_tokenisers_match_the_encoders():
    from PIL import Image
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    pngs = []
    for image in images:
        buffer = io.BytesIO(); Image.fromarray(image).save(buffer, format="PNG"); pngs.append({"bytes": buffer.getvalue()})
    gray = D.tokenise_image({"img": pngs, "label": [0, 1, 2]})
    assert np.array_equal(gray["input_ids"], D.image_encode(images)) and gray["label"] == [0, 1, 2]
    assert np.array_equal(D.tokenise_image({"img": pngs, "label": [0, 1, 2]}, rgb=True)["input_ids"],
                          D.image_encode(images, rgb=True))
    texts = ["a review", "Ünïcödé ✓" * 200]
    assert D.tokenise_text({"text": texts, "label": [1, 0]})["input_ids"] == [D.byte_encode(t) for t in texts]  # untruncated
    rows = make_listops(5, **PAPER, seed=2, num_proc=1)
    out = D.tokenise_listops({"Source": rows["Source"], "Target": rows["Target"]}, setting="lra")
    assert out == {"input_ids": [D.listops_encode(s) for s in rows["Source"]], "label": rows["Target"]}
    assert D.tokenise_ids({"input_ids": [[3, 1]], "label": [0], "length": [2]}) == {"input_ids": [[3, 1]], "label": [0]}
