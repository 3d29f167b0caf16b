"""Tests of hkt_nb.approximation: best approximations, Prop. 4.4, Thm. 4.3 split, Mardia, Student t."""
import math
import warnings

import pytest
import torch

from hkt_nb.attention import HierarchicalAttention, upsample_index, upsample_scores
from hkt_nb.theory.approximation import (absorbing_start, averaging_pyramid_, best_hierarchical_approximation, best_level_approximation,
                                         block_summary_errors, error_decomposition, excess_kurtosis, fit_hkt_scores,
                                         gaussian_entropy, geometric_tail_bound, hierarchical_search_path,
                                         bilinear_score_kurtosis, kurtosis_negentropy, kurtosis_report, mardia_effect_size, mardia_gaussian_effect,
                                         negentropy_validity, mardia_gaussian_value, mardia_kurtosis,
                                         mardia_z, planted_multiscale, pyramid_tokens, rank_lower_bound,
                                         rate_distortion_sandwich, student_t_entropy, student_t_mardia,
                                         student_t_negentropy, upsample_matrix)
from hkt_nb.theory.probes import ProbeTraining

f64 = torch.float64


def test_upsample_matrix_matches_layer_upsampling():
    S = torch.randn(1, 1, 4, 4, dtype=f64)
    U = upsample_matrix(7, 1)
    index, valid = upsample_index(7, 1, 2)
    torch.testing.assert_close(upsample_scores(S, index, valid)[0, 0], U @ S[0, 0] @ U.T, rtol=0, atol=0)


def test_best_level_exact_on_feasible_and_optimal():
    A = torch.randn(8, 2, dtype=f64) @ torch.randn(2, 8, dtype=f64)
    U = upsample_matrix(16, 1)
    torch.testing.assert_close(best_level_approximation(U @ A @ U.T, 1, 2), U @ A @ U.T, rtol=0, atol=1e-10)
    R = torch.randn(16, 16, dtype=f64)
    best = best_level_approximation(R, 1, 2)
    for _ in range(50):  # random feasible points never beat it
        B = torch.randn(8, 2, dtype=f64) @ torch.randn(2, 8, dtype=f64)
        assert (R - U @ B @ U.T).norm() >= (R - best).norm()
    # level 0: plain Eckart-Young
    s = torch.linalg.svdvals(R)
    assert abs((R - best_level_approximation(R, 0, 3)).norm().item() - s[3:].pow(2).sum().sqrt().item()) < 1e-10


def test_realisable_level_uses_token_span():
    tokens = torch.randn(8, 3, dtype=f64)
    Xb = torch.cat([tokens, torch.ones(8, 1, dtype=f64)], 1)
    W = torch.randn(4, 2, dtype=f64) @ torch.randn(2, 4, dtype=f64)
    U = upsample_matrix(16, 1)
    target = U @ Xb @ W @ Xb.T @ U.T
    torch.testing.assert_close(best_level_approximation(target, 1, 2, tokens=tokens), target, rtol=0, atol=1e-10)


def test_prop_4_4_bound_holds_on_planted_example():
    P = planted_multiscale(T=32, d_model=4, rank=4, n_levels=5, C=3.0, rho=0.6, seed=1)
    norms = [t.norm().item() for t in P["terms"]]
    assert all(abs(n - 3.0 * 0.6**l) < 1e-10 for l, n in enumerate(norms))
    for L in range(1, 6):
        S_H, _, errs = best_hierarchical_approximation(P["S_star"], L, 4, init=P["terms"][:L], sweeps=10)
        err = (P["S_star"] - S_H).norm().item()
        tail = (P["S_star"] - sum(P["terms"][:L])).norm().item()
        assert rank_lower_bound(P["S_star"], L, 4) <= err + 1e-9
        assert err <= tail + 1e-9 <= geometric_tail_bound(3.0, 0.6, L) + 2e-9
        assert all(a >= b - 1e-10 for a, b in zip(errs, errs[1:]))  # BCD never increases the error


def test_error_decomposition_triangle():
    g = torch.Generator().manual_seed(0)
    S, H, R, Sh = (torch.randn(6, 6, generator=g, dtype=f64) for _ in range(4))
    d = error_decomposition(S, H, R, Sh)
    assert d["total"] <= d["bound"]
    assert abs(d["bound"] - ((S - H).norm() + (H - R).norm() + (R - Sh).norm()).item()) < 1e-12
    # equality when the three error vectors are aligned
    d = error_decomposition(3 * S, 2 * S, S, 0 * S)
    assert abs(d["total"] - d["bound"]) < 1e-12
    with pytest.raises(ValueError):
        error_decomposition(S, H, R, torch.zeros(5, 5, dtype=f64))


def test_averaging_pyramid_gives_block_means_and_zero_quantisation():
    P = planted_multiscale(T=16, d_model=4, rank=4, n_levels=3, seed=0)
    layer = averaging_pyramid_(HierarchicalAttention(4, 1, n_levels=3).double())
    toks = pyramid_tokens(layer, P["X"])
    for l in range(3):
        torch.testing.assert_close(toks[l], P["Z"][l], rtol=0, atol=1e-12)
    S_R, _, _ = best_hierarchical_approximation(P["S_star"], 3, 4, tokens=toks, init=P["terms"], sweeps=2)
    assert (P["S_star"] - S_R).norm() < 1e-9


def test_block_summary_floor():
    X = torch.randn(4, 32, 3, dtype=f64)
    toks = torch.randn(4, 16, 3, dtype=f64)
    e = block_summary_errors(X, toks, 1)
    assert 0 <= e["floor"] <= e["summary"] <= 1 + 1e-12


def test_fit_hkt_scores_reduces_error_and_stays_realisable():
    P = planted_multiscale(T=16, d_model=4, rank=2, n_levels=3, seed=0)
    torch.manual_seed(0)
    layer = HierarchicalAttention(4, 1, n_levels=2).double()
    S_hat, errs = fit_hkt_scores(layer, P["X"], P["S_star"], ProbeTraining(steps=30, lr=1e-2))
    assert errs[-1] < errs[0]
    # S_hat lies in R_L: it equals sum_l U_l [X_l, 1] W_l [X_l, 1]^T U_l^T with W_l of rank <= d built from the
    # layer's parameters (homogeneous coordinates absorb the biases, W_l absorbs lambda_l / sqrt(d))
    toks = pyramid_tokens(layer, P["X"])
    total = torch.zeros_like(S_hat)
    with torch.no_grad():
        for l in range(2):
            Xb = torch.cat([toks[l], torch.ones(toks[l].shape[0], 1, dtype=f64)], 1)
            Wq = torch.cat([layer.q_proj[l].weight.T, layer.q_proj[l].bias[None]], 0)
            Wk = torch.cat([layer.k_proj[l].weight.T, layer.k_proj[l].bias[None]], 0)
            W = layer.lambdas[0, l] * Wq @ Wk.T / 2.0  # sqrt(d) = 2
            assert torch.linalg.matrix_rank(W) <= 4
            U = upsample_matrix(16, l)
            total += U @ Xb @ W @ Xb.T @ U.T
            # and the one-level realisable minimiser reproduces each such term exactly
            term = U @ Xb @ W @ Xb.T @ U.T
            torch.testing.assert_close(best_level_approximation(term, l, 4, tokens=toks[l]), term, rtol=0, atol=1e-9)
    torch.testing.assert_close(total, S_hat, rtol=0, atol=1e-10)


def test_mardia_hand_computed():
    # four points (+-1, 0), (0, +-1): mean 0, S = I/2, Mahalanobis^2 = 2 each -> b = 4
    x = torch.tensor([[1.0, 0], [-1, 0], [0, 1], [0, -1]], dtype=f64)
    assert abs(mardia_kurtosis(x) - 4.0) < 1e-12
    # 1-d: b_{2,1} = m4 / m2^2; for [-1, 1, -1, 1] it is 1
    assert abs(mardia_kurtosis(torch.tensor([[-1.0], [1.0], [-1.0], [1.0]])) - 1.0) < 1e-12
    # affine invariance
    A = torch.tensor([[2.0, 1.0], [0.5, -3.0]], dtype=f64)
    y = torch.randn(50, 2, dtype=f64)
    assert abs(mardia_kurtosis(y @ A.T + 7) - mardia_kurtosis(y)) < 1e-9


def test_mardia_gaussian_within_standard_errors():
    g = torch.Generator().manual_seed(0)
    for d in (1, 4, 32):
        x = torch.randn(20000, d, generator=g, dtype=f64)
        b = mardia_kurtosis(x)
        assert abs(mardia_z(b, d, 20000)) < 4
        assert mardia_gaussian_value(d) == d * (d + 2)
    assert excess_kurtosis(torch.randn(50000, 3, generator=g, dtype=f64)).abs().max() < 0.15


def test_mardia_student_t_sample():
    # multivariate t, n=3, nu=12: b = 15 * 10 / 8 = 18.75
    g = torch.Generator().manual_seed(0)
    n_s, nu = 400000, 12.0
    z = torch.randn(n_s, 3, generator=g, dtype=f64)
    w = torch.distributions.Chi2(torch.tensor(nu, dtype=f64)).sample((n_s,)) / nu
    b = mardia_kurtosis(z / w.sqrt()[:, None])
    assert abs(b - student_t_mardia(3, nu)) < 0.6


def test_mardia_errors():
    with pytest.raises(ValueError):
        mardia_kurtosis(torch.randn(3, 4))
    with pytest.raises(ValueError):
        mardia_kurtosis(torch.ones(10, 2))
    with pytest.raises(ValueError):
        mardia_kurtosis(torch.tensor([[float("nan")], [1.0], [2.0]]))


def test_student_t_entropy_known_values():
    # Cauchy (nu = 1, n = 1): h = log(4 pi)
    assert abs(student_t_entropy(1, 1.0) - math.log(4 * math.pi)) < 1e-12
    # scipy reference values (stats.t(5).entropy(), stats.multivariate_t(zeros(4), eye(4), df=10).entropy())
    assert abs(student_t_entropy(1, 5.0) - 1.627502672414396) < 1e-12
    assert abs(student_t_entropy(4, 10.0) - 6.060099242691403) < 1e-12
    assert abs(student_t_negentropy(8, 1e8)) < 1e-6 and student_t_negentropy(8, 10.0) > 0


def test_student_t_entropy_monte_carlo():
    g = torch.Generator().manual_seed(0)
    n, nu, N = 2, 6.0, 200000
    z = torch.randn(N, n, generator=g, dtype=f64)
    w = torch.distributions.Chi2(torch.tensor(nu, dtype=f64)).sample((N,)) / nu
    x = z / w.sqrt()[:, None]
    logp = (math.lgamma((nu + n) / 2) - math.lgamma(nu / 2) - n / 2 * math.log(nu * math.pi)
            - (nu + n) / 2 * torch.log1p(x.pow(2).sum(1) / nu))
    assert abs(-logp.mean().item() - student_t_entropy(n, nu)) < 0.02


def test_kurtosis_negentropy_approximation_limits():
    for n in (1, 4, 32):
        r = kurtosis_negentropy(student_t_mardia(n, 1000.0), n) / student_t_negentropy(n, 1000.0)
        assert 1.0 < r < 1.03
        with pytest.warns(UserWarning, match="outside the range"):
            r10 = kurtosis_negentropy(student_t_mardia(n, 10.0), n) / student_t_negentropy(n, 10.0)
        assert 2.2 < r10 < 6.5
    assert kurtosis_negentropy(mardia_gaussian_value(5), 5) == 0
    assert abs(kurtosis_negentropy(3 + 1.2, 1, warn=False) - 1.2**2 / 48) < 1e-15


def test_negentropy_validity_matches_the_student_t_measurement():
    # within 10 %: relative deviation of b from d(d+2) about 3.2 % (d = 1), 2.5 % (d = 4), 0.75 % (d = 32)
    for d, expected in ((1, 0.032), (4, 0.025), (32, 0.0075)):
        v = negentropy_validity(d)
        assert abs(v - expected) < 0.2 * expected
        nu = 4 + 2 / v  # the t with exactly that relative deviation: the approximation is within 10 % there
        ratio = kurtosis_negentropy(student_t_mardia(d, nu), d, warn=False) / student_t_negentropy(d, nu)
        assert 1.09 < ratio <= 1.1 + 1e-6
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kurtosis_negentropy(mardia_gaussian_value(4) * (1 + 0.5 * negentropy_validity(4)), 4)  # inside: no warning


def test_mardia_at_least_d_squared_with_equality_on_a_sphere():
    g = torch.Generator().manual_seed(0)
    for d in (1, 3, 8):
        for x in (torch.randn(d + 2, d, generator=g, dtype=f64), torch.rand(500, d, generator=g, dtype=f64),
                  torch.randn(400, d, generator=g, dtype=f64).pow(3)):
            assert mardia_kurtosis(x) >= d * d - 1e-9 and mardia_effect_size(mardia_kurtosis(x), d) >= -1e-12
        cross = torch.cat([torch.eye(d, dtype=f64), -torch.eye(d, dtype=f64)]) * 3.0 + 1.0  # +-e_k: a sphere
        assert abs(mardia_kurtosis(cross) - d * d) < 1e-9
    big = torch.randn(200000, 6, generator=g, dtype=f64)
    assert abs(mardia_effect_size(mardia_kurtosis(big), 6) - 1) < 0.05  # Gaussian: effect size 1 (se about 0.013)


def test_fused_score_kurtosis_formula_against_monte_carlo():
    g = torch.Generator().manual_seed(3)
    for D, r in ((16, 4), (32, 32)):
        W = torch.randn(D, r, generator=g, dtype=f64) @ torch.randn(r, D, generator=g, dtype=f64)
        x, y = torch.randn(400000, D, generator=g, dtype=f64), torch.randn(400000, D, generator=g, dtype=f64)
        s = ((x @ W) * y).sum(1)
        kurt = (s - s.mean()).pow(4).mean() / (s - s.mean()).pow(2).mean().pow(2)
        assert abs(kurt.item() - bilinear_score_kurtosis(W)) < 0.06  # 400,000 pairs: standard error <= 0.02
        assert bilinear_score_kurtosis(W) >= 3 + 6 / r - 1e-12
    # equal singular values: 3 + 6 / rank
    Q = torch.linalg.qr(torch.randn(10, 10, generator=g, dtype=f64))[0]
    assert abs(bilinear_score_kurtosis(Q[:, :5] @ Q[:, :5].T) - (3 + 6 / 5)) < 1e-12
    with pytest.raises(ValueError):
        bilinear_score_kurtosis(torch.zeros(3, 3))


def test_rate_distortion_sandwich():
    lo, hi = rate_distortion_sandwich(2.0, 4, 0.0, 2.0)
    assert lo == hi == 2.0 * math.exp(-1.0)
    lo, hi = rate_distortion_sandwich(2.0, 4, student_t_negentropy(4, 8.0))
    assert 0 < lo < hi
    assert abs(gaussian_entropy(1) - 0.5 * math.log(2 * math.pi * math.e)) < 1e-15


def test_kurtosis_report_fields():
    x = torch.randn(5000, 4, dtype=f64)
    rep = kurtosis_report(x)
    assert rep["gaussian"] == 24 and abs(rep["b_over_d"] - rep["b"] / 4) < 1e-12
    assert abs(rep["b_over_gaussian"] - rep["b"] / 24) < 1e-12
    assert abs(rep["effect_size"] - (rep["b"] - 16) / 8) < 1e-12 and rep["negentropy_in_range"] in (True, False)


def test_search_path_is_monotone_in_L_and_quantisation_vanishes_at_L1():
    # issue 10 findings 5-6: warm-started search never rises with L; at L = 1 the ideal and realisable classes coincide
    P = planted_multiscale(T=32, d_model=4, rank=4, n_levels=5, C=5.0, rho=0.5, seed=3)
    layer_rand = HierarchicalAttention(4, 1, n_levels=5).double()
    layer_avg = averaging_pyramid_(HierarchicalAttention(4, 1, n_levels=5).double())
    tok_rand, tok_avg = pyramid_tokens(layer_rand, P["X"]), pyramid_tokens(layer_avg, P["X"])
    path_I = hierarchical_search_path(P["S_star"], 5, 4, tokens=tok_avg, starts=P["terms"], sweeps=8)
    path_R = hierarchical_search_path(P["S_star"], 5, 4, tokens=tok_rand, sweeps=8)
    path_H = hierarchical_search_path(P["S_star"], 5, 2, sweeps=8)
    for path in (path_I, path_R, path_H):
        errors = [e for _, _, e in path]
        assert all(b <= a + 1e-12 for a, b in zip(errors, errors[1:]))
    assert torch.equal(path_I[0][0], path_R[0][0])  # quantisation term exactly 0 at L = 1
    for L in range(1, 6):
        S_I, S_R = path_I[L - 1][0], path_R[L - 1][0]
        # Thm. 4.3 (3): the quantisation term is at least the excess floor
        assert (S_I - S_R).norm() >= path_R[L - 1][2] - path_I[L - 1][2] - 1e-9
        assert rank_lower_bound(P["S_star"], L, 4) <= path_I[L - 1][2] + 1e-9


def test_hierarchical_class_is_not_closed():
    target = torch.diag(torch.tensor([1.0, -1.0], dtype=f64))
    ones = torch.ones(2, 2, dtype=f64)
    for a in (-3.0, 0.0, 0.5, 7.0, 1e4):
        assert abs(torch.linalg.det(target - a * ones).item() + 1) < 1e-6
    A0 = target - 1e6 * ones
    A0[0, 0] -= 1 / (1 + 1e6)
    assert torch.linalg.matrix_rank(A0) == 1 and (A0 + 1e6 * ones - target).norm() < 1e-5


def test_kurtosis_approximation_thresholds_issue_values():
    # issue 10 finding 7: 1.135 at nu = 50 (n = 1), below 1.10 only from nu about 66
    def ratio(n, nu):
        return kurtosis_negentropy(student_t_mardia(n, nu), n, warn=False) / student_t_negentropy(n, nu)
    assert abs(ratio(1, 50) - 1.135) < 1e-3
    assert ratio(1, 65) > 1.10 > ratio(1, 66)


@pytest.mark.parametrize("L", [4, 5])
def test_coarsest_level_absorbs_coarser_planted_levels_exactly(L):
    """Prop. 4.4, sharper form: T_{L-1} <= d makes the infimum over I_L exactly 0; the search finds it."""
    P = planted_multiscale(64, 8, rank=8, n_levels=6, C=10.0, rho=0.5, seed=0)
    start = absorbing_start(P["terms"], L, 8, tokens=P["Z"])
    assert len(start) == L and (P["S_star"] - sum(start)).norm() < 1e-9 * P["S_star"].norm()
    path = hierarchical_search_path(P["S_star"], L, 8, tokens=P["Z"], starts=P["terms"], sweeps=2)
    assert path[L - 1][2] < 1e-9 * P["S_star"].norm().item()
    # below the threshold (T_{L-1} = 16 > d at L = 3) the absorbing start is not exact
    assert (P["S_star"] - sum(absorbing_start(P["terms"], 3, 8, tokens=P["Z"]))).norm() > 1e-3
    with pytest.raises(ValueError):
        absorbing_start(P["terms"], 7, 8)


def test_gaussian_sample_effect_size_bias_monte_carlo():
    """E e = (n - d - 1)/(n + 1) for Gaussian samples (Mardia's E b = d(d+2)(n-1)/(n+1))."""
    g = torch.Generator().manual_seed(5)
    for n, d, reps in ((12, 5, 8000), (60, 8, 1500)):
        e = torch.tensor([mardia_effect_size(mardia_kurtosis(torch.randn(n, d, generator=g, dtype=f64)), d)
                          for _ in range(reps)])
        assert abs(e.mean().item() - mardia_gaussian_effect(n, d)) < 5 * e.std().item() / reps**0.5
    assert mardia_gaussian_effect(12, 5) == pytest.approx(6 / 13)
    assert kurtosis_report(torch.randn(40, 3, dtype=f64))["gaussian_sample_effect"] == pytest.approx(36 / 41)
    with pytest.raises(ValueError):
        mardia_gaussian_effect(5, 5)
