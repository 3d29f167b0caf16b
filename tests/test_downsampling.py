"""Tests of hkt_nb.downsampling: lengths, causality horizon, padding invariance."""
import pytest
import torch

from hkt_nb.downsampling import (
    CausalDownsample,
    Pyramid,
    level_lengths,
    receptive_field,
)


def test_level_lengths_known_values():
    assert level_lengths(13, 3, 2) == [13, 7, 4]
    assert level_lengths(1024, 4, 2) == [1024, 512, 256, 128]
    assert level_lengths(10, 2, 3) == [10, 4]
    with pytest.raises(ValueError):
        level_lengths(0, 3)


@pytest.mark.parametrize("kernel_size", [2, 3, 5])
def test_receptive_field_matches_autograd(kernel_size):
    pyr = Pyramid(4, n_levels=4, stride=2, kernel_size=kernel_size).double()
    for level in (1, 2, 3):
        for m in (0, 1, 3):
            x = torch.randn(1, 48, 4, dtype=torch.float64, requires_grad=True)
            pyr(x)[0][level][0, m].sum().backward()
            seen = (x.grad[0].abs().sum(-1) > 0).nonzero().flatten()
            lo, hi = receptive_field(level, m, 2, kernel_size)
            assert (int(seen.min()), int(seen.max())) == (max(lo, 0), hi)
            assert hi == (m + 1) * 2**level - 1  # never past the end of its own block


def test_pyramid_ignores_padding():
    pyr = Pyramid(8, 3, 2).double()
    x = torch.randn(2, 11, 8, dtype=torch.float64)
    kpm = torch.arange(11)[None] >= torch.tensor([[11], [5]])
    x2 = x.clone()
    x2[kpm] = 1e3
    (a, ma), (b, mb) = pyr(x, kpm), pyr(x2, kpm)
    for l in range(3):
        assert torch.equal(ma[l], mb[l])
        torch.testing.assert_close(a[l], b[l], rtol=0, atol=0)
        assert (a[l][ma[l]] == 0).all()
    assert ma[1][1].tolist() == [False, False, False, True, True, True]  # ceil(5/2) = 3 real coarse tokens


def test_downsample_errors():
    with pytest.raises(ValueError, match="kernel_size"):
        CausalDownsample(8, stride=3, kernel_size=2)
    with pytest.raises(ValueError, match="stride"):
        CausalDownsample(8, stride=1)
    with pytest.raises(ValueError, match="multiple"):
        CausalDownsample(8, 2)(torch.randn(1, 5, 8))
