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


def pyramid_padded_to_s_power(pyr: Pyramid, x, key_padding_mask=None):
    "The rule before issue 20 (a copy): pad the input once to a multiple of s^(L-1), then trim every level."
    import torch.nn.functional as F
    B, T, _ = x.shape
    lengths = level_lengths(T, pyr.n_levels, pyr.stride)
    T_pad = lengths[-1] * pyr.stride ** (pyr.n_levels - 1)
    pad = torch.zeros(B, T, dtype=torch.bool) if key_padding_mask is None else key_padding_mask
    pad = F.pad(pad, (0, T_pad - T), value=True)
    h = F.pad(x, (0, 0, 0, T_pad - T)).masked_fill(pad[..., None], 0.0)
    levels, masks = [h[:, :T]], [pad[:, :T]]
    for l, down in enumerate(pyr.down, start=1):
        h, pad = down(h), coarsen_padding_mask(pad, pyr.stride)
        h = h.masked_fill(pad[..., None], 0.0)
        levels.append(h[:, : lengths[l]])
        masks.append(pad[:, : lengths[l]])
    return levels, masks


@pytest.mark.parametrize("n_levels,stride,kernel_size", [(3, 2, None), (4, 2, 3), (3, 3, 5), (6, 2, None), (2, 4, 4)])
@pytest.mark.parametrize("T", [1, 7, 13, 32])
def test_per_level_padding_gives_the_levels_of_the_old_rule(n_levels, stride, kernel_size, T):
    "Padding each level to a multiple of s gives the levels of padding the input to s^(L-1) (to float rounding)."
    pyr = Pyramid(8, n_levels, stride, kernel_size).double()
    x = torch.randn(3, T, 8, dtype=torch.float64)
    for mask in (None, torch.arange(T)[None] >= torch.tensor([[T], [max(T - 4, 1)], [1]])):
        (new, new_masks), (old, old_masks) = pyr(x, mask), pyramid_padded_to_s_power(pyr, x, mask)
        assert [t.shape[1] for t in new] == level_lengths(T, n_levels, stride)
        for a, b in zip(new, old):  # the same sums; a shorter tensor may change the BLAS blocking, hence 1e-12
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
        assert all(torch.equal(a, b) for a, b in zip(new_masks, old_masks))


def step_input_lengths(pyr: Pyramid, T: int) -> list[int]:
    "The length of the tensor each downsampling step reads, for one input of length T."
    seen = []
    hooks = [down.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[1])) for down in pyr.down]
    levels, _ = pyr(torch.randn(1, T, 4))
    for hook in hooks:
        hook.remove()
    return seen, [t.shape[1] for t in levels]


@pytest.mark.parametrize("T,n_levels", [(8, 20), (64, 16), (3, 40)])
def test_many_levels_cost_order_T_per_level(T, n_levels):
    "Each step reads at most s ceil(T_l / s) <= T_l + s - 1 positions (the old rule padded T = 8, L = 20 to 524,288)."
    pyr = Pyramid(4, n_levels, 2)
    reads, lengths = step_input_lengths(pyr, T)
    assert lengths == level_lengths(T, n_levels, 2)
    assert reads == [2 * -(-t // 2) for t in lengths[:-1]]
    assert max(reads) <= T + 1 and sum(reads) <= 2 * T + 2 * n_levels
