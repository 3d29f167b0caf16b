"""Tests of hkt_nb.kernel (Prop. 3.1, our reconstruction): Gram = layer scores, PSD condition, feature map, rank."""
import itertools

import pytest
import torch

from hkt_nb.attention import HierarchicalAttention
from hkt_nb.theory.kernel import (
    feature_map,
    hierarchical_gram,
    inertia,
    is_psd,
    numerical_rank,
    rank_bound,
    subadditive_rank_bound,
    symmetrised_forms,
    tie_keys_to_queries,
)
from hkt_nb.theory.probes import lag_copy_batch

f64 = torch.float64


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("L,s", [(3, 2), (2, 3), (1, 2)])
def test_gram_equals_layer_scores(causal, L, s, randomise):
    layer = randomise(HierarchicalAttention(16, 2, L, s, causal=causal).double())
    x = torch.randn(2, 19, 16, dtype=f64)
    kpm = torch.arange(19)[None] >= torch.tensor([[19], [11]])
    ref = layer.scores(x, kpm).fused
    for h in range(2):
        torch.testing.assert_close(hierarchical_gram(layer, x, h, kpm), ref[:, h], rtol=0, atol=1e-12)


def test_psd_under_condition_feature_map_and_schur(randomise):
    layer = tie_keys_to_queries(randomise(HierarchicalAttention(16, 2, 3, 2).double()))
    x = torch.randn(2, 32, 16, dtype=f64) / 2
    for h in range(2):
        assert all(is_psd(M) for M in symmetrised_forms(layer, h))
        S = hierarchical_gram(layer, x, h)
        assert is_psd(S) and torch.allclose(S, S.mT, atol=1e-13)
        Phi = feature_map(layer, x, h)
        torch.testing.assert_close(Phi @ Phi.mT, S, rtol=0, atol=1e-11)
        assert is_psd(S.exp())


def test_rank_bound_known_values():
    # the counterexample to the old "tight" claim: T = 36, d = 12, L = 3 -> 30, not 33
    assert rank_bound(36, 12, 3) == 30 and subadditive_rank_bound(36, 12, 3) == 33
    assert rank_bound(20, 8, 4, 2) == 18 and subadditive_rank_bound(20, 8, 4, 2) == 20
    assert rank_bound(64, 8, 3, 2) == 24 and rank_bound(10, 8, 1) == 8
    with pytest.raises(ValueError):
        rank_bound(10, 0, 2)


@pytest.mark.parametrize("T,d,L,s", list(itertools.product([7, 20, 36], [2, 4, 8, 12], [1, 2, 3, 4], [2, 3])))
def test_random_weights_reach_rank_bound(T, d, L, s, randomise):
    """The sharper bound is reached by random untied weights (non-causal) and never exceeded (causal)."""
    assert rank_bound(T, d, L, s) <= subadditive_rank_bound(T, d, L, s)
    # unit-scale weights keep the coarse terms well above rounding (the tolerance is relative)
    layer = randomise(HierarchicalAttention(d, 1, L, s).double(), std=1.0)
    x = torch.randn(2, T, d, dtype=f64)
    assert (numerical_rank(hierarchical_gram(layer, x, 0), rtol=1e-13) == rank_bound(T, d, L, s)).all()
    causal = randomise(HierarchicalAttention(d, 1, L, s, causal=True).double(), std=1.0)
    assert (numerical_rank(hierarchical_gram(causal, x, 0), rtol=1e-13) <= rank_bound(T, d, L, s)).all()


def test_untied_layer_is_indefinite_with_d_plus_d_inertia():
    layer = HierarchicalAttention(32, 4, 3, 2).double()
    for M in symmetrised_forms(layer, 0):
        assert inertia(M) == (8, 8, 17)
    S = hierarchical_gram(layer, torch.randn(1, 64, 32, dtype=f64), 0)
    assert not is_psd(S)
    with pytest.raises(ValueError):
        feature_map(layer, torch.randn(1, 8, 32, dtype=f64), 0)


def test_is_psd_known_answers_and_errors():
    assert is_psd(torch.eye(3)) and is_psd(torch.zeros(3, 3)) and not is_psd(torch.diag(torch.tensor([1.0, -1e-3])))
    assert is_psd(torch.tensor([[1.0, 5.0], [-5.0, 1.0]]))  # only the symmetric part matters
    with pytest.raises(ValueError):
        is_psd(torch.ones(2, 3))
    with pytest.raises(ValueError):
        hierarchical_gram(HierarchicalAttention(8, 2), torch.randn(1, 4, 8), head=2)
    with pytest.raises(ValueError):
        lag_copy_batch(2, torch.randn(5, 4), lag=5)


def test_centred_sym_invariant_to_row_constants_and_detects_indefiniteness():
    from hkt_nb.theory.kernel import centred_sym, centred_sym_eigenvalues
    g = torch.Generator().manual_seed(0)
    S = torch.randn(3, 10, 10, dtype=torch.float64, generator=g)
    kpm = torch.arange(10)[None] >= torch.tensor([[10], [7], [3]])
    shifted = S + 20 * torch.randn(3, 10, 1, dtype=torch.float64, generator=g)  # a constant per row
    shifted = shifted.masked_fill(kpm[:, None, :] | kpm[:, :, None], 99.0)  # padded entries: anything
    torch.testing.assert_close(centred_sym(shifted, kpm), centred_sym(S, kpm), rtol=0, atol=1e-11)
    assert not torch.allclose(torch.linalg.eigvalsh((shifted + shifted.mT) / 2), torch.linalg.eigvalsh((S + S.mT) / 2))
    # a Gram matrix stays PSD; 1 (on the real positions) is in its kernel
    B = torch.randn(3, 10, 4, dtype=torch.float64, generator=g)
    ev = centred_sym_eigenvalues(B @ B.mT, kpm)
    assert ev.min() > -1e-10
    ones = (~kpm).double()
    assert (centred_sym(B @ B.mT, kpm) @ ones[..., None]).abs().max() < 1e-10
    # a known value: S = diag(1, -1) centred on 2 positions is J diag(1,-1) J = 0
    assert torch.allclose(centred_sym(torch.diag(torch.tensor([1.0, -1.0]))), torch.zeros(2, 2, dtype=torch.float64))
    with pytest.raises(ValueError):
        centred_sym(S, torch.ones(3, 10, dtype=torch.bool))


def test_single_head_inertia_is_bounded_but_not_fixed():
    from hkt_nb.theory.kernel import inertia, symmetrised_forms
    seen = set()
    for s in range(20):
        torch.manual_seed(s)
        p, q, z = inertia(symmetrised_forms(HierarchicalAttention(8, 1, n_levels=1).double(), 0)[0])
        assert 1 <= p <= 8 and q <= 8 and p + q + z == 9
        seen.add((p, q, z))
    assert len(seen) > 1
