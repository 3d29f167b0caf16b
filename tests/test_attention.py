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


def test_from_mha_rejects_unsupported():
    with pytest.raises(ValueError, match="^mha.*batch_first"):
        HierarchicalAttention.from_mha(nn.MultiheadAttention(16, 4))
    with pytest.raises(ValueError, match="^mha"):
        HierarchicalAttention.from_mha(nn.MultiheadAttention(16, 4, add_bias_kv=True, batch_first=True))
    with pytest.raises(TypeError, match="^mha"):
        HierarchicalAttention.from_mha(nn.Linear(16, 16))


# (class, valid keyword arguments, argument, bad value, exception)
LAYER = {"d_model": 16, "n_heads": 2}
BAD_ARGUMENTS = [(cls, LAYER, name, value, error) for cls in (HierarchicalAttention, MultiHeadAttention)
                 for name, value, error in [("d_model", 0, ValueError), ("n_heads", 0, ValueError), ("n_heads", 3, ValueError),
                                            ("n_heads", 32, ValueError), ("causal", 1, TypeError), ("dropout", 1.0, ValueError),
                                            ("dropout", -0.5, ValueError), ("dropout", "0.1", TypeError), ("bias", None, TypeError)]]
BAD_ARGUMENTS += [(HierarchicalAttention, LAYER, name, value, error) for name, value, error in [
    ("n_levels", 0, ValueError), ("stride", 1, ValueError), ("kernel_size", 1, ValueError),
    ("conv_kernel_size", 0, ValueError)]]


@pytest.mark.parametrize("cls,good,name,value,error", BAD_ARGUMENTS,
                         ids=[f"{b[0].__name__}-{b[2]}={b[3]!r}" for b in BAD_ARGUMENTS])
def test_constructor_rejects_bad_argument(cls, good, name, value, error):
    cls(**good)  # the valid arguments are accepted
    with pytest.raises(error, match=f"^{name}"):
        cls(**{**good, name: value})


@pytest.mark.parametrize("training", [False, True])
def test_from_mha_copies_mode(training, padded_batch, randomised_mha):
    mha = randomised_mha(dropout=0.1).train(training)
    layer = HierarchicalAttention.from_mha(mha)
    assert layer.training == training and layer.dropout == 0.1
    if not training:  # the quoted failure: eval MHA with dropout 0.1 converted to a training layer
        x, kpm = padded_batch()
        ref, _ = mha(x, x, x, key_padding_mask=kpm, need_weights=False)
        torch.testing.assert_close(layer(x, kpm), ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("n_levels,stride,bias", [(3, 2, True), (2, 3, False), (4, 2, True), (1, 2, True)])
def test_from_mha_is_a_trainable_twin(n_levels, stride, bias, padded_batch, randomised_mha):
    "Prop. 3.4: the twin equals MHA (padded query rows included), and every parameter trains from the second step."
    mha = randomised_mha(bias=bias)
    layer = HierarchicalAttention.from_mha(mha, n_levels=n_levels, stride=stride)
    x, kpm = padded_batch()
    for mask in (None, kpm):
        ref, _ = mha(x, x, x, key_padding_mask=mask, need_weights=False)
        for impl in ("fused", "explicit"):
            torch.testing.assert_close(layer(x, mask, impl=impl), ref, rtol=0, atol=1e-12)
    assert torch.all(layer.gates < 1)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    for step in (1, 2):
        optimizer.zero_grad()
        layer(x, kpm).pow(2).sum().backward()
        dead = [n for n, p in layer.named_parameters() if p.grad is None or not p.grad.any()]
        if n_levels == 1:  # lambda = softmax of one logit is constant: no gradient, by construction
            dead.remove("level_logits")
        if step == 1:  # the pyramid cannot get a first-step gradient (proved in the chapter); all else does
            assert all(n.startswith("pyramid.") for n in dead), dead
        else:
            assert dead == []
        optimizer.step()


def test_from_mha_float32_equals_to_rounding():
    mha = nn.MultiheadAttention(32, 4, batch_first=True)
    layer = HierarchicalAttention.from_mha(mha.eval())
    x = torch.randn(2, 50, 32)
    ref, _ = mha(x, x, x, need_weights=False)
    torch.testing.assert_close(layer(x), ref, rtol=1e-5, atol=1e-6)


def test_from_mha_causal(padded_batch, randomised_mha):
    mha = randomised_mha()
    layer = HierarchicalAttention.from_mha(mha, causal=True, kernel_size=3)
    assert layer.causal
    x, _ = padded_batch()
    mask = torch.ones(13, 13, dtype=torch.bool).triu(1)
    ref, _ = mha(x, x, x, attn_mask=mask, need_weights=False)
    for impl in ("fused", "explicit"):
        torch.testing.assert_close(layer(x, impl=impl), ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("keyword", ["dropout", "bias", "colour"])
def test_from_mha_refuses_keywords_it_takes_from_mha(keyword, randomised_mha):
    with pytest.raises(TypeError, match=f"^{keyword}"):
        HierarchicalAttention.from_mha(randomised_mha(), **{keyword: 0.1})


@pytest.mark.parametrize("cls", [HierarchicalAttention, MultiHeadAttention])
@pytest.mark.parametrize("causal", [False, True])
def test_explicit_finite_under_fp16_autocast(cls, causal):
    "Inputs scaled by 300: q k^T overflows float16; every explicit path stays finite where the fused one is."
    layer = cls(32, 4, causal=causal)
    x = 300 * torch.randn(2, 40, 32)
    kpm = torch.arange(40)[None] >= torch.tensor([[40], [25]])
    with torch.autocast("cpu", dtype=torch.float16):
        for mask in (None, kpm):
            assert layer(x, mask).isfinite().all()
            assert layer(x, mask, impl="explicit").isfinite().all()
            scores = layer.scores(x, mask)
            assert (scores.attention if cls is HierarchicalAttention else scores).isfinite().all()


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
    for bad, error in [(torch.randn(2, 10, 8), ValueError), (torch.randn(10, 16), ValueError),
                       (torch.randn(2, 0, 16), ValueError), (torch.ones(2, 10, 16, dtype=torch.long), TypeError),
                       (x.double(), TypeError), (x.numpy(), TypeError)]:
        with pytest.raises(error, match="^x"):
            layer(bad)
    bad_masks = [(torch.zeros(2, 10), TypeError), (torch.zeros(2, 9, dtype=torch.bool), ValueError)]
    if cls is HierarchicalAttention:  # not right padding: HKT's coarse levels need it, standard attention does not
        bad_masks.append((torch.tensor([[True] + [False] * 9] * 2), ValueError))
    for bad, error in bad_masks:
        with pytest.raises(error, match="^key_padding_mask"):
            layer(x, bad)
    with pytest.raises(ValueError, match="^impl"):
        layer(x, impl="flash")


@pytest.mark.parametrize("causal", [False, True])
def test_levels_are_what_the_projections_read(causal, padded_batch, randomise):
    layer = randomise(HierarchicalAttention(16, 4, 3, 2, causal=causal).double())
    x, kpm = padded_batch()
    tokens, masks = layer.levels(x, kpm)
    pyramid_levels, pyramid_masks = layer.pyramid(x, kpm)
    assert torch.equal(tokens[0], x) and [t.shape[1] for t in tokens] == [13, 7, 4]  # finite x: as given
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


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("layer", [HierarchicalAttention(16, 2), HierarchicalAttention(16, 2, causal=True),
                                   MultiHeadAttention(16, 2)], ids=["hkt", "hkt-causal", "mha"])
def test_attention_layers_compile_in_one_graph(layer, masked, graph_breaks):
    mask = torch.arange(12)[None] >= torch.tensor([[12], [9]])
    assert graph_breaks(layer, torch.randn(2, 12, 16), mask if masked else None) == (0, [])


def test_many_levels_for_a_short_sequence_are_cheap_and_exact(randomise):
    "T = 8 at L = 20 (issue 20): the forms agree, and the levels are the ceil(T / 2^l) tokens, no more."
    layer = randomise(HierarchicalAttention(8, 2, n_levels=20)).double()
    x = torch.randn(2, 8, 8, dtype=f64)
    kpm = torch.arange(8)[None] >= torch.tensor([[8], [5]])
    tokens, _ = layer.levels(x, kpm)
    assert [t.shape[1] for t in tokens] == [8, 4, 2] + [1] * 17
    torch.testing.assert_close(layer(x, kpm), layer(x, kpm, impl="explicit"), rtol=0, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_mha_accepts_left_padding_and_holes(causal, randomise):
    "Standard attention has no blocks: any key_padding_mask, equal to torch's MHA on every query with a real key."
    torch_mha = randomise(nn.MultiheadAttention(16, 4, batch_first=True).double())
    ours = MultiHeadAttention(16, 4, causal=causal).double()
    with torch.no_grad():
        ours.qkv_proj.weight.copy_(torch_mha.in_proj_weight)
        ours.qkv_proj.bias.copy_(torch_mha.in_proj_bias)
        ours.out_proj.load_state_dict(torch_mha.out_proj.state_dict())
    x = torch.randn(3, 9, 16, dtype=f64)
    kpm = torch.zeros(3, 9, dtype=torch.bool)
    kpm[0, :3] = True  # left padding
    kpm[1, [2, 5, 6]] = True  # holes
    kpm[2, ::2] = True  # every other position
    causal_mask = torch.ones(9, 9, dtype=torch.bool).triu(1) if causal else None
    ref, _ = torch_mha(x, x, x, key_padding_mask=kpm, attn_mask=causal_mask, need_weights=False)
    has_key = ~kpm.cummin(-1).values if causal else torch.ones(3, 9, dtype=torch.bool)  # a real key up to t
    for impl in ("fused", "explicit"):
        out = ours(x, kpm, impl=impl)
        assert out.isfinite().all()  # a causal query before every real key: its row is lifted, finite
        torch.testing.assert_close(out[has_key], ref[has_key], rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="right padding.*contiguous blocks"):  # HKT keeps its rule
        HierarchicalAttention(16, 4).double()(x, kpm)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("cls", [HierarchicalAttention, MultiHeadAttention])
def test_nan_and_inf_in_padded_positions_do_not_reach_real_tokens(cls, causal, randomise):
    layer = randomise(cls(16, 4, causal=causal)).double()
    x = torch.randn(2, 11, 16, dtype=f64)
    kpm = torch.arange(11)[None] >= torch.tensor([[11], [6]])
    clean = x.masked_fill(kpm[..., None], 0.0)
    dirty = clean.clone()
    dirty[1, 6:8], dirty[1, 8:] = float("nan"), float("inf")
    dirty[1, 9, :3] = -float("inf")
    for impl in ("fused", "explicit"):
        out = layer(dirty, kpm, impl=impl)
        assert out.isfinite().all()
        torch.testing.assert_close(out, layer(clean, kpm, impl=impl), rtol=0, atol=0)
        if cls is HierarchicalAttention:
            assert all(s.isfinite().all() for s in layer.scores(dirty, kpm).levels)


def test_install_page_parameter_counts_are_the_layers(repo_root):
    """The per-layer parameter counts that the drop-in section of the page *Installing, building and contributing*
    (nbs/98_install.ipynb, moved there from the README) quotes (D = 128, H = 4) are those of the layers."""
    import re

    import nbformat
    page = nbformat.read(repo_root / "nbs" / "98_install.ipynb", as_version=4)
    text = re.sub(r"\s+", " ", "\n".join(c.source for c in page.cells if c.cell_type == "markdown"))
    quoted = re.search(r"`MultiHeadAttention` ([\d,]+) parameters; HKT with 1 level \(attention plus the hybrid "
                       r"convolution\) ([\d,]+); 2 levels ([\d,]+); 3 levels ([\d,]+)", text)
    assert quoted, "the install page's cost sentence changed: update this test"
    counts = [sum(p.numel() for p in layer.parameters()) for layer in
              [MultiHeadAttention(128, 4)] + [HierarchicalAttention(128, 4, n_levels=L) for L in (1, 2, 3)]]
    assert [int(n.replace(",", "")) for n in quoted.groups()] == counts


# ---------------------------------------------------------------- a new user's GPT script (issue 18): bias, init
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_levels,kernel_size", [(1, None), (3, None), (3, 3)])
def test_bias_false_removes_every_bias(causal, n_levels, kernel_size):
    "`bias=False` reaches the projections, the hybrid convolution and every pyramid step (depthwise and pointwise)."
    from hkt_nb.downsampling import CausalDownsample, Pyramid

    with_bias = HierarchicalAttention(16, 2, n_levels, causal=causal, kernel_size=kernel_size)
    without = HierarchicalAttention(16, 2, n_levels, causal=causal, kernel_size=kernel_size, bias=False)
    biases = [n for n, _ in with_bias.named_parameters() if n.endswith("bias")]
    assert len(biases) == 2 * n_levels + 3 + 2 * (n_levels - 1)  # q, k per level; v, out, value_conv; 2 per step
    assert not [n for n, _ in without.named_parameters() if n.endswith("bias")]
    assert sum(p.numel() for p in with_bias.parameters()) - sum(p.numel() for p in without.parameters()) == 16 * len(biases)
    assert not [n for n, _ in Pyramid(8, 3, bias=False).named_parameters() if n.endswith("bias")]
    assert CausalDownsample(8, 2, bias=False).depthwise.bias is None
    assert [n for n, _ in MultiHeadAttention(16, 2, bias=False).named_parameters() if n.endswith("bias")] == []
    x = torch.zeros(2, 9, 16)
    assert torch.equal(without(x), torch.zeros(2, 9, 16))  # a layer without biases maps zeros to zeros


@pytest.mark.parametrize("bias", [True, False])
def test_bias_false_layer_decodes_exactly(bias, randomise):
    from hkt_nb.decoding import cached_forward

    layer = randomise(HierarchicalAttention(16, 4, 3, causal=True, bias=bias).double()).eval()
    x = torch.randn(2, 37, 16, dtype=torch.float64)
    torch.testing.assert_close(cached_forward(layer, x, 5), layer(x), rtol=0, atol=1e-12)


@pytest.mark.parametrize("cls,kwargs", [(HierarchicalAttention, {"n_levels": 3, "kernel_size": 3, "causal": True}),
                                        (HierarchicalAttention, {"n_levels": 1}), (MultiHeadAttention, {})])
def test_reset_parameters_draws_what_the_constructor_draws(cls, kwargs):
    "After a GPT-style `_init_weights` redraw, `reset_parameters` restores the layer's own init (sqrt(L) included)."
    torch.manual_seed(3)
    fresh = cls(16, 2, **kwargs)
    layer = cls(16, 2, **kwargs)
    for module in layer.modules():
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
    torch.manual_seed(3)
    layer.reset_parameters()
    for (name, a), b in zip(fresh.state_dict().items(), layer.state_dict().values()):
        assert torch.equal(a, b), name
    if cls is HierarchicalAttention and kwargs["n_levels"] == 3:
        plain = torch.nn.Linear(16, 16)  # the default draw has std 1/sqrt(3 D): the queries have sqrt(L) times it
        ratio = layer.q_proj[0].weight.std() / plain.weight.std()
        assert 1.4 < ratio < 2.1  # sqrt(3) = 1.73 up to sampling
