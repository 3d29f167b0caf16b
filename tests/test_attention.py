"""Tests of hkt_nb.attention: the two forms agree, Prop. 3.4 holds, causality, masks, bad input."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hkt_nb.attention import (
    HierarchicalAttention,
    MultiHeadAttention,
    upsample_index,
    upsample_scores,
)

f64 = torch.float64


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_levels,stride,kernel_size", [(3, 2, None), (2, 3, 4), (4, 2, 3), (1, 2, None)])
def test_fused_equals_explicit(causal, n_levels, stride, kernel_size, padded_batch, randomise):
    layer = randomise(HierarchicalAttention(16, 4, n_levels, stride, causal=causal, kernel_size=kernel_size).double())
    x, kpm = padded_batch()  # T = 13: not a multiple of s^(L-1)
    for mask in (None, kpm):
        fused, explicit = layer(x, mask, impl="fused"), layer(x, mask, impl="explicit")
        torch.testing.assert_close(fused, explicit, rtol=0, atol=1e-12)


def test_fused_scores_are_the_sum_of_upsampled_levels(padded_batch, randomise):
    layer = randomise(HierarchicalAttention(16, 4, 3, 2).double())
    x, _ = padded_batch()
    sc = layer.scores(x)
    manual = torch.zeros_like(sc.fused)
    for l, s in enumerate(sc.levels):
        assert s.shape[-1] == math.ceil(13 / 2**l)
        idx, valid = upsample_index(13, l, 2)
        U = torch.zeros(13, s.shape[-1], dtype=f64)
        U[torch.arange(13), idx] = 1
        manual += sc.lambdas[:, l][None, :, None, None] * (U @ s @ U.T)
    torch.testing.assert_close(sc.fused, manual, rtol=0, atol=1e-12)
    torch.testing.assert_close(sc.lambdas.sum(-1), torch.ones(4, dtype=f64))
    assert sc.lambdas.shape == (4, 3) and sc.gates.shape == (4,)


@pytest.mark.parametrize("bias", [True, False])
def test_from_mha_equals_mha(bias, padded_batch, randomise):
    mha = randomise(nn.MultiheadAttention(16, 4, bias=bias, batch_first=True).double())
    layer = HierarchicalAttention.from_mha(mha, n_levels=3, stride=2)
    x, kpm = padded_batch()
    for mask in (None, kpm):
        ref, _ = mha(x, x, x, key_padding_mask=mask, need_weights=False)  # padded query rows included
        for impl in ("fused", "explicit"):
            torch.testing.assert_close(layer(x, mask, impl=impl), ref, rtol=0, atol=1e-12)


def test_from_mha_after_training_step_levels_still_matter(padded_batch, randomise):
    "from_mha is exact, and the layer it returns is a full HKT layer: coarse levels become active when trained."
    mha = randomise(nn.MultiheadAttention(16, 4, batch_first=True).double())
    layer = HierarchicalAttention.from_mha(mha)
    x, _ = padded_batch()
    layer(x).pow(2).sum().backward()
    assert layer.q_proj[1].weight.grad.abs().sum() > 0


def test_from_mha_rejects_unsupported():
    with pytest.raises(ValueError, match="batch_first"):
        HierarchicalAttention.from_mha(nn.MultiheadAttention(16, 4))
    with pytest.raises(ValueError):
        HierarchicalAttention.from_mha(nn.MultiheadAttention(16, 4, add_bias_kv=True, batch_first=True))
    with pytest.raises(TypeError):
        HierarchicalAttention.from_mha(nn.Linear(16, 16))


def test_gate_zero_is_causal_depthwise_convolution(padded_batch, randomise):
    "Prop. 3.4, second half: g = 0 gives W_O(causal depthwise conv of V)."
    layer = randomise(HierarchicalAttention(16, 4, 3, 2, conv_kernel_size=3).double())
    with torch.no_grad():
        layer.gate_logits.fill_(-50.0)
    x, kpm = padded_batch()
    v = F.linear(x, layer.v_proj.weight, layer.v_proj.bias)
    c = F.conv1d(F.pad(v.transpose(1, 2), (2, 0)), layer.value_conv.weight, layer.value_conv.bias, groups=16)
    ref = F.linear(c.transpose(1, 2), layer.out_proj.weight, layer.out_proj.bias)
    for impl in ("fused", "explicit"):
        torch.testing.assert_close(layer(x, kpm, impl=impl), ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("impl", ["fused", "explicit"])
@pytest.mark.parametrize("kernel_size", [None, 3])
def test_causal_mode_does_not_leak(impl, kernel_size, randomise):
    layer = randomise(HierarchicalAttention(16, 2, 3, 2, causal=True, kernel_size=kernel_size).double())
    x = torch.randn(2, 21, 16, dtype=f64)
    for i in range(0, 21, 4):
        x2 = x.clone()
        x2[:, i + 1:] += torch.randn_like(x2[:, i + 1:])
        torch.testing.assert_close(layer(x, impl=impl)[:, : i + 1], layer(x2, impl=impl)[:, : i + 1], rtol=0, atol=1e-12)


def test_nearest_upsampling_would_leak():
    "The completed-block map is what prevents the leak: nearest upsampling reads a block that ends after i."
    idx, valid = upsample_index(8, 1, 2, causal=False)
    assert idx[2] == 1 and 2 * (idx[2] + 1) - 1 > 2  # position 2 reads a block ending at 3
    idx, valid = upsample_index(8, 1, 2, causal=True)
    assert all((2 * (m + 1) - 1) <= i for i, (m, ok) in enumerate(zip(idx.tolist(), valid.tolist())) if ok)


def test_real_outputs_ignore_padding_content_and_length(randomise):
    layer = randomise(HierarchicalAttention(16, 4, 3, 2).double())
    x = torch.randn(1, 7, 16, dtype=f64)
    alone = layer(x)
    for extra in (1, 6, 9):
        xp = torch.cat([x, 50 * torch.randn(1, extra, 16, dtype=f64)], 1)
        kpm = torch.arange(7 + extra)[None] >= 7
        for impl in ("fused", "explicit"):
            torch.testing.assert_close(layer(xp, kpm, impl=impl)[:, :7], alone, rtol=0, atol=1e-12)


@pytest.mark.parametrize("cls", ["hkt", "mha"])
def test_fully_padded_row_is_finite_with_finite_gradients(cls):
    layer = HierarchicalAttention(16, 4).double() if cls == "hkt" else MultiHeadAttention(16, 4).double()
    x = torch.randn(2, 10, 16, dtype=f64, requires_grad=True)
    kpm = torch.zeros(2, 10, dtype=torch.bool)
    kpm[1] = True  # second sequence entirely padding
    for impl in ("fused", "explicit"):
        out = layer(x, kpm, impl=impl)
        assert torch.isfinite(out).all()
        out.sum().backward()
        assert torch.isfinite(x.grad).all() and all(torch.isfinite(p.grad).all() for p in layer.parameters())
        x.grad = None
        layer.zero_grad()


def test_gradcheck_tiny_layer(randomise):
    layer = randomise(HierarchicalAttention(4, 2, 2, 2).double())
    x = torch.randn(1, 5, 4, dtype=f64, requires_grad=True)
    kpm = torch.tensor([[False, False, False, False, True]])
    for impl in ("fused", "explicit"):
        assert torch.autograd.gradcheck(lambda inp: layer(inp, kpm, impl=impl), (x,))


def test_bf16_autocast_forward_is_finite(padded_batch):
    layer = HierarchicalAttention(32, 4)
    x, kpm = padded_batch(D=32, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for impl in ("fused", "explicit"):
            out = layer(x, kpm, impl=impl)
            assert torch.isfinite(out.float()).all()
    ref = layer(x, kpm)
    assert (out.float() - ref).abs().max() < 0.1  # bf16 keeps 8 bits of mantissa


def test_mha_baseline_matches_torch_mha(padded_batch, randomise):
    torch_mha = randomise(nn.MultiheadAttention(16, 4, batch_first=True).double())
    ours = MultiHeadAttention(16, 4).double()
    with torch.no_grad():
        ours.qkv_proj.weight.copy_(torch_mha.in_proj_weight)
        ours.qkv_proj.bias.copy_(torch_mha.in_proj_bias)
        ours.out_proj.load_state_dict(torch_mha.out_proj.state_dict())
    x, kpm = padded_batch()
    ref, _ = torch_mha(x, x, x, key_padding_mask=kpm, need_weights=False)
    for impl in ("fused", "explicit"):
        torch.testing.assert_close(ours(x, kpm, impl=impl), ref, rtol=0, atol=1e-12)


def test_upsample_scores_is_UsUt():
    s = torch.randn(2, 3, 4, 4, dtype=f64)
    idx, valid = upsample_index(8, 1, 2)
    U = F.one_hot(idx, 4).to(f64)
    torch.testing.assert_close(upsample_scores(s, idx, valid), U @ s @ U.T, rtol=0, atol=0)


@pytest.mark.parametrize("cls", [HierarchicalAttention, MultiHeadAttention])
def test_bad_inputs_raise_clear_errors(cls):
    layer = cls(16, 4)
    x = torch.randn(2, 10, 16)
    with pytest.raises(ValueError, match="shape"):
        layer(torch.randn(2, 10, 8))
    with pytest.raises(ValueError, match="shape"):
        layer(torch.randn(10, 16))
    with pytest.raises(TypeError, match="floating"):
        layer(torch.ones(2, 10, 16, dtype=torch.long))
    with pytest.raises(TypeError, match="dtype"):
        layer(x.double())
    with pytest.raises(TypeError, match="bool"):
        layer(x, torch.zeros(2, 10))
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        layer(x, torch.zeros(2, 9, dtype=torch.bool))
    with pytest.raises(ValueError, match="right padding"):
        layer(x, torch.tensor([[True] + [False] * 9] * 2))
    with pytest.raises(ValueError, match="impl"):
        layer(x, impl="flash")
    with pytest.raises(ValueError, match="T = 0"):
        layer(torch.randn(2, 0, 16))
    with pytest.raises(ValueError, match="n_heads must divide"):
        cls(10, 4)


@pytest.mark.parametrize("causal", [False, True])
def test_levels_are_what_the_projections_read(causal, padded_batch, randomise):
    layer = randomise(HierarchicalAttention(16, 4, 3, 2, causal=causal).double())
    x, kpm = padded_batch()
    tokens, masks = layer.levels(x, kpm)
    pyramid_levels, pyramid_masks = layer.pyramid(x, kpm)
    assert tokens[0] is x and [t.shape[1] for t in tokens] == [13, 7, 4]
    for level in (1, 2):
        assert torch.equal(tokens[level], pyramid_levels[level]) and torch.equal(masks[level], pyramid_masks[level])
    qs, _ = layer.level_queries_keys(x, kpm)
    for q, proj, t in zip(qs, layer.q_proj, tokens):
        torch.testing.assert_close(q.transpose(1, 2).flatten(2), proj(t), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="key_padding_mask"):
        layer.levels(x, kpm[:, :5])


@pytest.mark.parametrize("causal", [False, True])
def test_upsample_index_is_the_block_map_of_eq2(causal):
    T, s = 11, 2
    for level in range(4):
        index, valid = upsample_index(T, level, s, causal)
        for i in range(T):
            expected = (i + 1) // s**level - 1 if causal else i // s**level
            assert bool(valid[i]) == (expected >= 0) and (expected < 0 or int(index[i]) == expected)
