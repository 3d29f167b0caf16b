"""Tests of hkt_nb.asymmetry (Props. 3.5-3.6, our reconstruction)."""
import pytest
import torch

from hkt_nb.attention import HierarchicalAttention, upsample_index, upsample_scores
from hkt_nb.theory.asymmetry import (centre_rows, double_centre, form_reciprocity, key_share, level_key_share, iid_reciprocity_reference, lag_profile, level_reciprocity,
                                     reciprocity, reciprocity_parts, reciprocity_ratio, set_level_antisymmetric, set_level_symmetric,
                                     sym_antisym_split)
from hkt_nb.theory.kernel import hierarchical_gram, tie_keys_to_queries

f64 = torch.float64


def test_split_unique_orthogonal_and_commutes_with_congruence_and_upsampling():
    A = torch.randn(4, 6, 6, dtype=f64)
    A_s, A_a = sym_antisym_split(A)
    torch.testing.assert_close(A_s + A_a, A, rtol=0, atol=1e-15)
    assert torch.equal(A_s, A_s.mT) and torch.equal(A_a, -A_a.mT)
    assert (A_s * A_a).sum((-1, -2)).abs().max() < 1e-13
    # uniqueness: splitting a symmetric (antisymmetric) matrix returns it unchanged
    assert torch.equal(sym_antisym_split(A_s)[1], torch.zeros_like(A_s)) and torch.equal(sym_antisym_split(A_a)[0], torch.zeros_like(A_a))
    C = torch.randn(9, 6, dtype=f64)
    torch.testing.assert_close(sym_antisym_split(C @ A @ C.T)[1], C @ A_a @ C.T)
    index, valid = upsample_index(12, 1, 2)
    up = lambda m: upsample_scores(m[:, None], index, valid)[:, 0]
    torch.testing.assert_close(sym_antisym_split(up(A))[0], up(A_s), rtol=0, atol=0)
    with pytest.raises(ValueError):
        sym_antisym_split(torch.ones(2, 3))


def test_reciprocity_ratio_known_values():
    S = torch.randn(5, 5, dtype=f64)
    assert reciprocity_ratio(S + S.T).item() == pytest.approx(1.0)
    assert reciprocity_ratio(S - S.T).item() == pytest.approx(0.0, abs=1e-15)
    assert reciprocity_ratio(torch.zeros(3, 3)).item() == 1.0
    shift = torch.diag(torch.ones(4), -1)
    assert reciprocity_ratio(shift).item() == pytest.approx(0.5)


def test_symmetric_condition_layer_has_reciprocity_one_and_antisymmetric_zero():
    layer = tie_keys_to_queries(HierarchicalAttention(16, 2, 3, 2).double())
    x = torch.randn(3, 21, 16, dtype=f64)
    kpm = torch.arange(21)[None] >= torch.tensor([[21], [15], [4]])
    torch.testing.assert_close(reciprocity(layer, x, kpm, centring="none"), torch.ones(2, 3, dtype=f64))
    set_level_antisymmetric(layer, 2)
    r = reciprocity(layer, x, kpm, centring="none")
    assert r[:, 2].abs().max() < 1e-20 and torch.allclose(r[:, :2], torch.ones(2, 2, dtype=f64))
    assert form_reciprocity(layer, drop_key_constant=False)[:, 2].abs().max() < 1e-20
    # fused antisymmetric part = sum of the per-level ones (only level 2 contributes)
    S, grams = hierarchical_gram(layer, x, 1, kpm, return_levels=True)
    i, v = upsample_index(21, 2, 2)
    lam = layer.lambdas[1, 2].detach()
    torch.testing.assert_close(sym_antisym_split(S)[1], lam * upsample_scores(grams[2][:, None], i, v)[:, 0], rtol=0, atol=1e-12)


def test_random_layer_reciprocity_strictly_between_and_set_symmetric():
    layer = HierarchicalAttention(16, 2, 2, 2).double()
    r = reciprocity(layer, torch.randn(2, 16, 16, dtype=f64))
    assert ((r > 0) & (r < 1)).all()
    set_level_symmetric(layer, 1)
    assert torch.allclose(form_reciprocity(layer, drop_key_constant=False)[:, 1], torch.ones(2, dtype=f64))
    with pytest.raises(ValueError):
        set_level_antisymmetric(HierarchicalAttention(6, 2, 2), 0)  # odd head width


def test_lag_profile_of_a_shift():
    n, k = 10, 3
    A = torch.diag(torch.ones(n - k, dtype=f64), -k)  # row i scores column i - k
    prof = lag_profile(A, 5, centred=False)
    assert prof.argmax().item() == k and prof[k] > 0 and torch.allclose(prof[[0, 1, 2, 4, 5]], torch.zeros(5, dtype=f64))


def test_centred_reciprocity_invariant_to_any_row_constant_with_padding():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(4, 3, 9, 9, dtype=f64, generator=g)
    kpm = torch.arange(9)[None] >= torch.tensor([[9], [6], [3], [2]])
    shifted = scores + 50 * torch.randn(4, 3, 9, 1, dtype=f64, generator=g)  # a random constant per row
    shifted = shifted.masked_fill(kpm[:, None, None, :], -7.0)  # padded keys changed as well
    torch.testing.assert_close(centre_rows(shifted, kpm), centre_rows(scores, kpm), rtol=0, atol=1e-12)
    torch.testing.assert_close(level_reciprocity(shifted, kpm), level_reciprocity(scores, kpm), rtol=0, atol=1e-12)
    assert (level_reciprocity(shifted, kpm, "none") - level_reciprocity(scores, kpm, "none")).abs().min() > 0.01
    # the centred rows have zero mean over real keys and zero padded columns
    c = centre_rows(scores, kpm)
    assert c.masked_fill(kpm[:, None, None, :], 0).sum(-1).abs().max() < 1e-12
    assert torch.equal(c.masked_select(kpm[:, None, None, :].expand_as(c)), torch.zeros(int(kpm.sum()) * 27, dtype=f64))
    with pytest.raises(ValueError):
        centre_rows(scores, torch.ones(4, 9, dtype=torch.bool))  # no real key
    with pytest.raises(ValueError):
        centre_rows(scores, kpm[:, :5])


def test_layer_reciprocity_invariant_to_key_bias_which_adds_row_constants():
    torch.manual_seed(0)
    layer = HierarchicalAttention(16, 2, 3, 2).double()
    x = torch.randn(3, 21, 16, dtype=f64)
    kpm = torch.arange(21)[None] >= torch.tensor([[21], [15], [5]])
    before, raw_before = reciprocity(layer, x, kpm), reciprocity(layer, x, kpm, centring="none")
    attn_before = layer.scores(x, kpm).attention
    with torch.no_grad():
        for k in layer.k_proj:  # q_i . b_K and b_Q . b_K do not depend on the key
            k.bias.add_(3 * torch.randn_like(k.bias))
    torch.testing.assert_close(layer.scores(x, kpm).attention, attn_before, rtol=0, atol=1e-12)  # softmax unchanged
    torch.testing.assert_close(reciprocity(layer, x, kpm), before, rtol=0, atol=1e-12)
    assert (reciprocity(layer, x, kpm, centring="none") - raw_before).abs().max() > 1e-3


def test_iid_reference_against_monte_carlo():
    sizes = [16, 11, 4]
    g = torch.Generator().manual_seed(1)
    kpm = torch.arange(16)[None] >= torch.tensor(sizes)[:, None]
    draws = torch.randn(600, 3, 1, 16, 16, dtype=f64, generator=g)
    for centring in ("double", "rows", "none"):
        est = torch.stack([level_reciprocity(d, kpm, centring) for d in draws]).mean().item()
        assert abs(est - iid_reciprocity_reference(sizes, centring)) < 6e-3  # about 5 standard errors
    assert iid_reciprocity_reference([32], "rows") == pytest.approx(33 / 64)
    assert iid_reciprocity_reference([32]) == pytest.approx(32 / 62)
    with pytest.raises(ValueError):
        iid_reciprocity_reference([5], "columns")
    with pytest.raises(ValueError):
        iid_reciprocity_reference([1, 5])


def test_decomposition_of_row_centred_reciprocity_into_invariant_and_key_only_parts():
    """Prop. 3.6 (vii): r(G Pi) = (1 - sigma) r(Pi G Pi) + sigma / 2 exactly; Pi G Pi ignores row and column constants."""
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(4, 3, 9, 9, dtype=f64, generator=g) + 2 * torch.randn(4, 3, 1, 9, dtype=f64, generator=g)
    kpm = torch.arange(9)[None] >= torch.tensor([[9], [6], [3], [2]])
    sigma = level_key_share(scores, kpm)
    assert ((sigma > 0.05) & (sigma < 1)).all()
    torch.testing.assert_close(level_reciprocity(scores, kpm, "rows"),
                               (1 - sigma) * level_reciprocity(scores, kpm) + sigma / 2, rtol=0, atol=1e-12)
    both = scores + 5 * torch.randn(4, 3, 9, 1, dtype=f64, generator=g) + 5 * torch.randn(4, 3, 1, 9, dtype=f64, generator=g)
    torch.testing.assert_close(double_centre(both, kpm), double_centre(scores, kpm), rtol=0, atol=1e-11)
    dc = double_centre(scores, kpm)  # zero row and column sums over real tokens, zero padded rows and columns
    assert dc.sum(-1).abs().max() < 1e-12 and dc.sum(-2).abs().max() < 1e-12
    assert dc.masked_select(kpm[:, None, :, None].expand_as(dc)).abs().max() == 0
    # the key-only part alone: r = (1 + t)^2 / (2 (1 + t^2)) after the invisible shift t b 1^T
    b = torch.tensor([1.0, -2.0, 0.5, 0.5], dtype=f64)
    for t in (-1.0, -0.3, 0.0, 2.0):
        K = torch.ones(4, 1, dtype=f64) * b + t * b[:, None]
        assert reciprocity_ratio(K).item() == pytest.approx((1 + t) ** 2 / (2 * (1 + t**2)), abs=1e-12)


def test_layer_parts_consistent_and_invariant_measure_keeps_prop_iii():
    torch.manual_seed(1)
    layer = HierarchicalAttention(16, 2, 3, 2).double()
    x = torch.randn(3, 21, 16, dtype=f64)
    kpm = torch.arange(21)[None] >= torch.tensor([[21], [15], [5]])
    parts = reciprocity_parts(layer, x, kpm)
    torch.testing.assert_close(parts["invariant"], reciprocity(layer, x, kpm), rtol=0, atol=0)
    torch.testing.assert_close(parts["key_share"], key_share(layer, x, kpm), rtol=0, atol=0)
    sig = parts["key_share"]
    torch.testing.assert_close(parts["rows"], (1 - sig) * parts["invariant"] + sig / 2, rtol=0, atol=1e-12)
    set_level_symmetric(layer, 0)
    set_level_antisymmetric(layer, 1)
    r = reciprocity(layer, x, kpm)
    torch.testing.assert_close(r[:, 0], torch.ones(2, dtype=f64))
    assert r[:, 1].abs().max() < 1e-20
    assert (reciprocity(layer, x, kpm, "rows")[:, 1] > 0.01).all()  # the row-centred measure loses (iii)
    with pytest.raises(ValueError):
        reciprocity(layer, x, kpm, "columns")
