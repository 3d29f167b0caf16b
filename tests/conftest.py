import os

import pytest
import torch

os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


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
