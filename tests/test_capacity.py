"""Tests of hkt_nb.capacity: Prop. 3.4 constructors (float64), the strictness task, the conv bound, training."""
import pytest
import torch
from torch import nn

from hkt_nb.attention import HierarchicalAttention
from hkt_nb.theory.capacity import (
    CausalConvMixer,
    SingleLayerRegressor,
    as_causal_conv,
    causal_depthwise_conv,
    conv_mse_lower_bound,
    conv_only_layer,
    conv_path_reference,
    marker_difference_task,
    mean_plus_difference,
    mean_plus_difference_layer,
    train_marker_difference,
    window_mse_lower_bound,
)
from hkt_nb.theory.probes import ProbeTraining

f64 = torch.float64


@pytest.mark.parametrize("n_levels,stride", [(1, 2), (3, 2), (2, 3)])
def test_from_mha_equals_mha(n_levels, stride, padded_batch, randomise):
    mha = randomise(nn.MultiheadAttention(12, 3, batch_first=True).double())
    x, kpm = padded_batch(D=12, lengths=(13, 8, 2))
    ref, _ = mha(x, x, x, key_padding_mask=kpm, need_weights=False)
    hkt = HierarchicalAttention.from_mha(mha, n_levels=n_levels, stride=stride)
    for impl in ("fused", "explicit"):
        torch.testing.assert_close(hkt(x, kpm, impl=impl), ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("conv_kernel_size", [1, 3, 5])
def test_closed_gate_is_conv(conv_kernel_size, padded_batch, randomise):
    layer = randomise(HierarchicalAttention(12, 3, n_levels=3, conv_kernel_size=conv_kernel_size).double())
    conv = as_causal_conv(layer)
    assert torch.equal(conv.gates, torch.zeros(3, dtype=f64))
    assert layer.gates.ne(0).all()  # the original is untouched
    x, kpm = padded_batch(D=12, lengths=(13, 8, 2))
    ref = conv_path_reference(layer, x)
    for impl in ("fused", "explicit"):
        torch.testing.assert_close(conv(x, kpm, impl=impl), ref, rtol=0, atol=1e-12)


def test_conv_reference_known_answer():
    x = torch.arange(5, dtype=f64).reshape(1, 5, 1)  # 0 1 2 3 4
    w = torch.tensor([[1.0, -1.0]], dtype=f64)  # y_t = x_{t-1} - x_t
    assert causal_depthwise_conv(x, w).flatten().tolist() == [0.0, -1.0, -1.0, -1.0, -1.0]
    y = causal_depthwise_conv(x, torch.tensor([[0.0, -1.0, 1.0]], dtype=f64), torch.tensor([2.0], dtype=f64))
    assert y.flatten().tolist() == [2.0, 3.0, 3.0, 3.0, 3.0]  # x_t - x_{t-1} + 2


def test_conv_only_layer_matches_given_kernel(padded_batch):
    x, _ = padded_batch(D=6)
    w, b = torch.randn(6, 2, dtype=f64), torch.randn(6, dtype=f64)
    layer = conv_only_layer(w, b, n_heads=2, conv_kernel_size=4)
    torch.testing.assert_close(layer(x), causal_depthwise_conv(x, w, b), rtol=0, atol=1e-12)
    # the gate stays closed under training: its gradient is exactly zero
    layer(x).sum().backward()
    assert torch.equal(layer.gate_logits.grad, torch.zeros(2, dtype=f64))
    with pytest.raises(ValueError):
        conv_only_layer(w, conv_kernel_size=1)


def test_bad_inputs():
    with pytest.raises(TypeError):
        as_causal_conv(nn.Linear(2, 2))
    with pytest.raises(ValueError):
        causal_depthwise_conv(torch.randn(1, 4, 3), torch.randn(2, 3))
    with pytest.raises(ValueError):
        marker_difference_task(0, 8)
    with pytest.raises(ValueError):
        SingleLayerRegressor("rnn", 8, 16)


def test_task_determinism_and_answers():
    a = marker_difference_task(16, 10, torch.Generator().manual_seed(3))
    b = marker_difference_task(16, 10, torch.Generator().manual_seed(3))
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    feats, y = a
    v, m = feats[..., 0], feats[..., 1]
    assert torch.equal(m.sum(1), torch.ones(16))
    p = m.argmax(1)
    expected = v[torch.arange(16), p][:, None] + v - torch.cat([torch.zeros(16, 1), v[:, :-1]], 1)
    torch.testing.assert_close(y, expected, rtol=0, atol=0)


def test_conv_bound_values():
    # issue 10 finding 2: the affine residual is 1 - |W_t|/T^2 (not 1 - |W_t|/T, which is the Bayes bound)
    lb = conv_mse_lower_bound(8, 3)
    torch.testing.assert_close(lb, 1 - torch.tensor([1, 2, 3, 3, 3, 3, 3, 3], dtype=f64) / 64)
    assert abs(conv_mse_lower_bound(32, 32).mean().item() - (1 - 33 / 2048)) < 1e-12
    wb = window_mse_lower_bound(8, 3)
    torch.testing.assert_close(wb, torch.tensor([7, 6, 5, 5, 5, 5, 5, 5], dtype=f64) / 8)
    assert abs(window_mse_lower_bound(32, 32).mean().item() - 31 / 64) < 1e-12
    # width 1: v_{t-1} is unseen for t >= 1, but cancels when the flag sits at t - 1 (probability 1/T):
    # affine residual 3 - (1 + 1/T)^2 = 2 - 2/T - 1/T^2, Bayes error 2 - 3/T (not 2 - 1/T^2 and 2 - 1/T)
    torch.testing.assert_close(conv_mse_lower_bound(4, 1), torch.tensor([1 - 1 / 16] + [2 - 2 / 4 - 1 / 16] * 3, dtype=f64))
    torch.testing.assert_close(window_mse_lower_bound(4, 1), torch.tensor([1 - 1 / 4] + [2 - 3 / 4] * 3, dtype=f64))
    torch.testing.assert_close(window_mse_lower_bound(2, 1), torch.tensor([0.5, 0.5], dtype=f64))  # T = 2, t = 1: flag at 0 half the time
    assert (window_mse_lower_bound(16, 5) <= conv_mse_lower_bound(16, 5)).all()


def test_window_bound_is_attained_by_window_bayes_predictor():
    # the Bayes predictor from the window (flag inside: exact; outside: 0) has per-position MSE -> the bound
    T, k, n = 8, 3, 40000
    feats, y = marker_difference_task(n, T, torch.Generator().manual_seed(0), dtype=f64)
    v, m = feats[..., 0], feats[..., 1]
    pred = torch.zeros_like(y)
    for t in range(T):
        lo = max(0, t - k + 1)
        pred[:, t] = (v[:, lo:t + 1] * m[:, lo:t + 1]).sum(1) + v[:, t] - (v[:, t - 1] if t else 0)
    mse = (pred - y).pow(2).mean(0)
    assert ((mse - window_mse_lower_bound(T, k)).abs() < 0.05).all()


def test_width_one_bayes_predictor_attains_the_bound():
    # k = 1: the Bayes predictor from (v_t, m_t) is v_t (1 + m_t); its error is the bound 2 - 3/T at t >= 1
    T, n = 6, 100000
    feats, y = marker_difference_task(n, T, torch.Generator().manual_seed(2), dtype=f64)
    v, m = feats[..., 0], feats[..., 1]
    mse = (y - v * (1 + m)).pow(2).mean(0)
    assert ((mse - window_mse_lower_bound(T, 1)).abs() < 0.03).all()


@pytest.mark.parametrize("k", [1, 2, 3, 8])
def test_affine_bound_matches_least_squares_monte_carlo(k):
    T, n = 8, 40000
    feats, y = marker_difference_task(n, T, torch.Generator().manual_seed(1), dtype=f64)
    bound = conv_mse_lower_bound(T, k)
    for t in range(T):
        lo = max(0, t - k + 1)
        window = torch.cat([feats[:, lo:t + 1].flatten(1), torch.ones(n, 1, dtype=f64)], 1)
        resid = y[:, t:t + 1] - window @ torch.linalg.lstsq(window, y[:, t:t + 1]).solution
        assert abs(resid.pow(2).mean().item() - bound[t].item()) < 0.03


@pytest.mark.parametrize("n_levels,stride,k", [(1, 2, 2), (3, 2, 3), (2, 3, 4)])
def test_mean_plus_difference_layer_is_exact(n_levels, stride, k):
    x = torch.randn(3, 11, 5, dtype=f64)
    layer = mean_plus_difference_layer(5, n_levels, stride, k).double()
    for impl in ("fused", "explicit"):
        torch.testing.assert_close(layer(x, impl=impl), mean_plus_difference(x), rtol=0, atol=1e-12)
    # known answer: f_t = mean + x_t - x_{t-1}
    x1 = torch.tensor([[[1.0], [2.0], [6.0]]], dtype=f64)
    torch.testing.assert_close(mean_plus_difference(x1), torch.tensor([[[4.0], [4.0], [7.0]]], dtype=f64))
    with pytest.raises(ValueError):
        mean_plus_difference_layer(5, conv_kernel_size=1)


@pytest.mark.parametrize("n_levels,stride", [(1, 2), (3, 2), (2, 3)])
def test_causal_witness_layer_is_exact_and_not_time_invariant(n_levels, stride):
    x = torch.randn(3, 11, 5, dtype=f64)
    layer = mean_plus_difference_layer(5, n_levels, stride, causal=True).double()
    for impl in ("fused", "explicit"):
        torch.testing.assert_close(layer(x, impl=impl), mean_plus_difference(x, causal=True), rtol=0, atol=1e-12)
    # known answer: causal means 1, 1.5, 3 plus differences 1, 1, 4
    x1 = torch.tensor([[[1.0], [2.0], [6.0]]], dtype=f64)
    torch.testing.assert_close(mean_plus_difference(x1, causal=True), torch.tensor([[[2.0], [2.5], [7.0]]], dtype=f64))
    # causality: changing the future leaves the past alone
    later = x.clone()
    later[:, 7:] += 1.0
    torch.testing.assert_close(layer(later)[:, :7], layer(x)[:, :7], rtol=0, atol=1e-12)
    # not time-invariant: the lag-2 coefficient is 1/3 at t = 2 and 1/4 at t = 3 (a convolution would give one value)
    e0, e1 = torch.zeros(1, 6, 1, dtype=f64), torch.zeros(1, 6, 1, dtype=f64)
    e0[0, 0], e1[0, 1] = 1.0, 1.0
    assert layer(e0.expand(1, 6, 5).clone())[0, 2, 0].item() == pytest.approx(1 / 3, abs=1e-12)
    assert layer(e1.expand(1, 6, 5).clone())[0, 3, 0].item() == pytest.approx(1 / 4, abs=1e-12)


def test_single_head_attention_sign_obstruction():
    """The proof's two probes: any single-head attention has o_t = a_{t,j} x_j M on one-token inputs, so the
    responses to x_{t-1} and to x_t have the same sign along any direction; f needs opposite signs."""
    torch.manual_seed(0)
    for _ in range(5):
        att = nn.MultiheadAttention(4, 1, batch_first=True, bias=False).double()
        T, t, e = 6, 3, torch.randn(4, dtype=f64)
        responses = []
        for j in (t - 1, t):
            x = torch.zeros(1, T, 4, dtype=f64)
            x[0, j] = e
            responses.append(att(x, x, x, need_weights=False)[0][0, t] @ e)
        target = [mean_plus_difference(torch.eye(T, dtype=f64)[None, :, [j]])[0, t, 0].item() for j in (t - 1, t)]
        assert target[0] < 0 < target[1]
        assert responses[0] * responses[1] >= 0


def test_models_and_training_are_deterministic():
    for kind in ("hkt", "mha", "conv"):
        runs = []
        for _ in range(2):
            torch.manual_seed(0)
            model = SingleLayerRegressor(kind, 8, 16)
            runs.append(train_marker_difference(model, T=16, training=ProbeTraining(steps=5, lr=3e-3, eval_every=5, num_threads=1),
                                                batch_size=8, eval_size=32))
        assert runs[0]["train_loss"] == runs[1]["train_loss"]
        assert len(runs[0]["train_loss"]) == 5 and runs[0]["eval_steps"] == [5]
        assert runs[0]["n_parameters"] == sum(p.numel() for p in model.parameters())


def test_conv_mixer_is_hkt_conv_path(padded_batch):
    mixer = CausalConvMixer(6, 3).double()
    x, _ = padded_batch(D=6)
    ref = causal_depthwise_conv(mixer.v_proj(x), mixer.value_conv.weight[:, 0], mixer.value_conv.bias)
    torch.testing.assert_close(mixer(x), mixer.out_proj(ref), rtol=0, atol=1e-12)


def test_target_variance_per_position():
    # Var y_0 = 2 + 2/T (Cov(v_p, v_0) = 1/T), Var y_t = 3 for t >= 1: the normaliser of the chapter's floors
    T, n = 4, 200000
    _, y = marker_difference_task(n, T, torch.Generator().manual_seed(3), dtype=f64)
    var = y.var(0)
    assert abs(var[0].item() - (2 + 2 / T)) < 0.03 and (var[1:] - 3).abs().max() < 0.05


def test_from_mha_gradients_at_the_converted_point():
    """Ch. 13: at the converted point the coarse scores are exactly 0, so the pyramid and the kept halves of the coarse
    projections get exactly zero gradient (and the key biases, at every point); the zeroed halves, gate, convolution and
    fusion logits get non-zero ones."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 2, batch_first=True).double()
    x = torch.randn(2, 13, 16, dtype=torch.float64)
    kpm = torch.arange(13)[None] >= torch.tensor([[13], [9]])
    layer = HierarchicalAttention.from_mha(mha, n_levels=3, stride=2)
    layer(x, kpm).pow(2).sum().backward()
    d = layer.head_dim
    kept_q = (torch.arange(16) % d) < (d + 1) // 2
    for p in layer.pyramid.parameters():
        assert torch.equal(p.grad, torch.zeros_like(p.grad))
    for level in (1, 2):
        q, k = layer.q_proj[level], layer.k_proj[level]
        assert torch.equal(q.weight.grad[kept_q], torch.zeros_like(q.weight.grad[kept_q]))
        assert torch.equal(q.bias.grad[kept_q], torch.zeros_like(q.bias.grad[kept_q]))
        assert torch.equal(k.weight.grad[~kept_q], torch.zeros_like(k.weight.grad[~kept_q]))
        assert q.weight.grad[~kept_q].abs().max() > 1e-6 and k.weight.grad[kept_q].abs().max() > 1e-6
    for p in (layer.gate_logits, layer.value_conv.weight, layer.level_logits, layer.q_proj[0].weight):
        assert p.grad.abs().max() > 1e-6
    # the narrowed claim: every tensor outside the pyramid except the key biases moves (relative thresholds)
    g_max = max(p.grad.abs().max().item() for p in layer.parameters())
    pyramid = {id(p) for p in layer.pyramid.parameters()}
    still = sorted(n for n, p in layer.named_parameters() if id(p) not in pyramid and not p.grad.abs().max() > 1e-8 * g_max)
    assert still == [f"k_proj.{l}.bias" for l in range(3)]
    assert all(layer.k_proj[l].bias.grad.abs().max() < 1e-10 * g_max for l in range(3))


def test_key_bias_gradient_is_zero_at_every_point():
    """Ch. 13: a key bias shifts each score row by a constant, which the softmax ignores, so its gradient is 0 at any
    parameter point of a non-causal layer; in a causal layer only for the fine level (the completed-block map breaks it)."""
    torch.manual_seed(3)
    x = torch.randn(2, 13, 16, dtype=torch.float64)
    kpm = torch.arange(13)[None] >= torch.tensor([[13], [9]])
    for causal in (False, True):
        layer = HierarchicalAttention(16, 2, n_levels=3, stride=2, causal=causal).double()
        with torch.no_grad():
            for p in layer.parameters():
                p.normal_(0, 0.3)
        layer(x, kpm).pow(2).sum().backward()
        g_max = max(p.grad.abs().max().item() for p in layer.parameters())
        rel = [layer.k_proj[l].bias.grad.abs().max().item() / g_max for l in range(3)]
        assert rel[0] < 1e-10
        assert all(r < 1e-10 for r in rel[1:]) if not causal else all(r > 1e-8 for r in rel[1:])


def test_adamw_decay_opens_a_closed_gate():
    """Ch. 13: a zero gradient keeps gamma under Adam, but AdamW's decoupled decay moves it towards 0."""
    for opt_cls, opens in ((torch.optim.Adam, False), (torch.optim.AdamW, True)):
        gamma = torch.tensor(-1000.0, requires_grad=True)
        opt = opt_cls([gamma], lr=0.1, weight_decay=0.1) if opt_cls is torch.optim.AdamW else opt_cls([gamma], lr=0.1)
        for _ in range(400):
            gamma.grad = torch.zeros_like(gamma)
            opt.step()
        assert (torch.sigmoid(gamma).item() > 0) == opens
