"""Tests of hkt_nb.downsampling: lengths, causality horizon, padding invariance, argument checks."""
import pytest
import torch

from hkt_nb.downsampling import (
    CausalDownsample,
    Pyramid,
    coarsen_padding_mask,
    level_lengths,
    receptive_field,
)


def test_level_lengths_known_values():
    assert level_lengths(13, 3, 2) == [13, 7, 4]
    assert level_lengths(1024, 4, 2) == [1024, 512, 256, 128]
    assert level_lengths(10, 2, 3) == [10, 4]
    for T in range(1, 40):
        assert level_lengths(T, 4, 3) == [-(-T // 3**l) for l in range(4)]


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


def test_coarsen_padding_mask_marks_a_block_padding_iff_it_is_all_padding():
    for length in range(9):
        mask = torch.arange(8)[None] >= length
        coarse = coarsen_padding_mask(mask, 2)
        assert coarse.tolist() == [[bool(mask[0, 2 * m: 2 * m + 2].all()) for m in range(4)]]


# (class, valid keyword arguments, argument, bad value, exception)
BAD_ARGUMENTS = [
    (CausalDownsample, {"d_model": 8}, "d_model", 0, ValueError),
    (CausalDownsample, {"d_model": 8}, "stride", 1, ValueError),
    (CausalDownsample, {"d_model": 8}, "stride", 2.0, TypeError),
    (CausalDownsample, {"d_model": 8, "stride": 3}, "kernel_size", 2, ValueError),
    (CausalDownsample, {"d_model": 8}, "bias", "yes", TypeError),
    (Pyramid, {"d_model": 8}, "d_model", -1, ValueError),
    (Pyramid, {"d_model": 8}, "n_levels", 0, ValueError),
    (Pyramid, {"d_model": 8}, "stride", 1, ValueError),
    (Pyramid, {"d_model": 8}, "kernel_size", 1, ValueError),
]


@pytest.mark.parametrize("cls,good,name,value,error", BAD_ARGUMENTS,
                         ids=[f"{b[0].__name__}-{b[2]}={b[3]!r}" for b in BAD_ARGUMENTS])
def test_constructor_rejects_bad_argument(cls, good, name, value, error):
    cls(**good)  # the valid arguments are accepted
    with pytest.raises(error, match=f"^{name}"):
        cls(**{**good, name: value})


@pytest.mark.parametrize("call,name", [(lambda: level_lengths(0, 3), "T"), (lambda: level_lengths(8, 0), "n_levels"),
                                       (lambda: level_lengths(8, 3, 1), "stride"), (lambda: receptive_field(-1, 0), "level"),
                                       (lambda: receptive_field(1, -1), "m"), (lambda: receptive_field(1, 0, 2, 1), "kernel_size")])
def test_functions_reject_bad_arguments(call, name):
    with pytest.raises(ValueError, match=f"^{name}"):
        call()


def test_downsample_needs_a_multiple_of_the_stride():
    with pytest.raises(ValueError, match="^x"):
        CausalDownsample(8, 2)(torch.randn(1, 5, 8))
