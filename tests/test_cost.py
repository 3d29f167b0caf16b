"""Tests of hkt_nb.cost: the score-cost series, analytic FLOP counts against FlopCounterMode, saved bytes."""
import pytest
import torch

from hkt_nb.attention import HierarchicalAttention, MultiHeadAttention
from hkt_nb.cost import (
    count_flops,
    flop_counter_excess,
    hkt_flops,
    mha_flops,
    saved_tensor_bytes,
    score_cost_ratio,
    score_excess_bound,
    score_flops,
)


def test_score_cost_ratio_known_values():
    assert score_cost_ratio(3, 2) == 1.3125
    assert score_cost_ratio(1, 2) == 1.0
    for L in range(1, 8):
        for s in (2, 3, 4):
            assert abs(score_cost_ratio(L, s) - sum(s ** (-2 * l) for l in range(L))) < 1e-14
            assert score_cost_ratio(L, s) < s**2 / (s**2 - 1)
    with pytest.raises(ValueError):
        score_cost_ratio(0)
    with pytest.raises(ValueError):
        score_cost_ratio(3, 1)


def test_score_flops_matches_series_when_divisible():
    assert score_flops(64, 8, 3, 2) / score_flops(64, 8, 1, 2) == 1.3125
    assert score_flops(100, 8, 3, 2) == 2 * 8 * (100**2 + 50**2 + 25**2)
    assert score_flops(13, 4, 3, 2) == 2 * 4 * (13**2 + 7**2 + 4**2)  # ceil lengths


@pytest.mark.parametrize("T,L,s,k", [(37, 3, 2, None), (32, 2, 3, 4), (20, 1, 2, None)])
@pytest.mark.parametrize("impl", ["explicit", "fused"])
@pytest.mark.parametrize("backward", [False, True])
def test_hkt_analytic_equals_flop_counter(T, L, s, k, impl, backward):
    B, D, H = 2, 16, 2
    layer = HierarchicalAttention(D, H, L, s, kernel_size=k)
    x = torch.randn(B, T, D, requires_grad=True)
    counted = count_flops(layer, x, impl, backward, sdpa_math=True)["total"]
    analytic = hkt_flops(B, T, D, H, L, s, kernel_size=k, impl=impl, backward=backward)["total"]
    excess = flop_counter_excess(B, T, D, L, s, kernel_size=k) if backward else 0
    assert counted == analytic + excess


@pytest.mark.parametrize("impl", ["explicit", "fused"])
@pytest.mark.parametrize("backward", [False, True])
def test_mha_analytic_equals_flop_counter(impl, backward):
    mha = MultiHeadAttention(16, 2)
    x = torch.randn(2, 24, 16, requires_grad=True)
    assert count_flops(mha, x, impl, backward, sdpa_math=True)["total"] == mha_flops(2, 24, 16, 2, impl, backward)["total"]


def test_fused_scores_cost_L_times_mha_and_flash_counts_zero():
    B, T, D, H, L = 1, 32, 16, 2, 3
    h, m = hkt_flops(B, T, D, H, L, impl="fused"), mha_flops(B, T, D, H)
    assert h["scores"] == L * m["scores"] and h["values"] == L * m["values"]
    e = hkt_flops(B, T, D, H, L, impl="explicit")
    assert e["scores"] == B * H * score_flops(T, D // H, L) and e["values"] == m["values"]
    layer, x = HierarchicalAttention(D, H, L), torch.randn(B, T, D)
    default = count_flops(layer, x, "fused", sdpa_math=False)["total"]
    assert default == h["total"] - h["scores"] - h["values"]  # the CPU flash SDPA op is counted as 0


def test_saved_tensor_bytes_meta_matches_cpu_for_explicit_and_scales_quadratically():
    layer = HierarchicalAttention(16, 2, 3)
    cpu = saved_tensor_bytes(layer, torch.randn(1, 64, 16, requires_grad=True), impl="explicit")[1]
    meta_layer = HierarchicalAttention(16, 2, 3).to("meta")
    meta = saved_tensor_bytes(meta_layer, torch.empty(1, 64, 16, device="meta", requires_grad=True), impl="explicit")[1]
    assert cpu == meta > 0
    big = saved_tensor_bytes(layer, torch.randn(1, 256, 16, requires_grad=True), impl="explicit")[1]
    assert big > 10 * cpu  # T x 4 -> T^2 terms x 16


def test_bad_inputs():
    with pytest.raises(ValueError):
        hkt_flops(1, 10, 10, 3)
    with pytest.raises(ValueError):
        mha_flops(1, 10, 8, 2, impl="flash")


def test_score_excess_bound_is_tight_and_attained():
    """Ch. 10: the excess of the exact ratio over the series is at most the bound, with equality iff T = 1 mod s^(L-1)."""
    for s in (2, 3):
        for L in range(2, 5):
            for T in range(1, 200):
                excess = score_flops(T, 1, L, s) / score_flops(T, 1, 1, s) - score_cost_ratio(L, s)
                bound = score_excess_bound(T, L, s)
                assert -1e-12 <= excess <= bound + 1e-12
                if T % s ** (L - 1) == 1:
                    assert abs(excess - bound) < 1e-12
    assert score_excess_bound(64, 1) == 0.0
    assert score_excess_bound(5, 2) == pytest.approx(2 * 0.5 * 0.5 / 5 + 0.25 / 25)  # T_1 = 3 = 5/2 + 1/2
    with pytest.raises(ValueError):
        score_excess_bound(0, 3)
