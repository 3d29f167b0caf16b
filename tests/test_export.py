"""Tests of variable-length export, tracing and vmap (issue 20, item 4): `torch.export` with a dynamic T, run at
lengths that are not multiples of the stride or of s^(L-1), equals eager; `torch.jit.trace` at the traced length;
`torch.func.vmap` over a batch with a key_padding_mask; which value checks run where (`can_check_values`)."""
import warnings

import pytest
import torch

from hkt_nb.attention import HierarchicalAttention, MultiHeadAttention, can_check_values
from hkt_nb.model import ClassifierConfig, HKTClassifier

f64 = torch.float64
DYNAMIC = torch.export.Dim.DYNAMIC  # torch narrows the range itself; named Dim ranges are tested below (issue 35)


def right_padded(B, T, lengths, dtype=f64):
    "A batch x (B, T, 16) and its right-padding mask for the given real lengths."
    return torch.randn(B, T, 16, dtype=dtype), torch.arange(T)[None] >= torch.tensor(lengths)[:, None]


def exported(module, *args):
    "`module` exported with the length axis (dim 1) of every argument dynamic."
    return torch.export.export(module, args, dynamic_shapes=tuple({1: DYNAMIC} for _ in args))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_levels,stride", [(3, 2), (2, 3)])
def test_exported_layer_equals_eager_at_three_lengths(causal, n_levels, stride, randomise, one_thread):
    layer = randomise(HierarchicalAttention(16, 4, n_levels=n_levels, stride=stride, causal=causal, kernel_size=stride + 1)).double().eval()
    x, mask = right_padded(2, 12, [12, 9])
    program = exported(layer, x, mask).module()
    for T in (13, 17, 31):  # none a multiple of s^(L-1) (4 or 3); 13, 17 and 31 not multiples of the stride
        x, mask = right_padded(2, T, [T, T - 5])
        torch.testing.assert_close(program(x, mask), layer(x, mask), rtol=0, atol=1e-12)


def test_exported_layer_without_mask_and_mha_equal_eager(one_thread):
    hkt, mha = HierarchicalAttention(16, 4).double().eval(), MultiHeadAttention(16, 4).double().eval()
    x, mask = right_padded(2, 12, [12, 9])
    hkt_program = exported(hkt, x).module()
    mha_program = exported(mha, x, mask).module()
    for T in (13, 17, 31):
        x, mask = right_padded(2, T, [T, 2])
        torch.testing.assert_close(hkt_program(x), hkt(x), rtol=0, atol=1e-12)
        torch.testing.assert_close(mha_program(x, mask), mha(x, mask), rtol=0, atol=1e-12)


def test_exported_classifier_equals_eager_at_three_lengths(one_thread):
    cfg = ClassifierConfig(vocab_size=11, n_classes=3, max_len=64, d_model=16, n_heads=4, n_layers=2)
    model = HKTClassifier(cfg).double().eval()
    ids, mask = torch.randint(0, 11, (2, 12)), torch.arange(12)[None] >= torch.tensor([[12], [7]])
    program = exported(model, ids, mask).module()
    for T in (13, 17, 61):
        ids, mask = torch.randint(0, 11, (2, T)), torch.arange(T)[None] >= torch.tensor([[T], [T - 6]])
        torch.testing.assert_close(program(ids, mask), model(ids, mask), rtol=0, atol=1e-12)


def test_exported_program_refuses_lengths_with_a_one_token_level(one_thread):
    "Export specialises sizes of 1: the program is valid for T > s^(L-1) and says so at shorter lengths."
    layer = HierarchicalAttention(16, 4, n_levels=3).double().eval()
    program = exported(layer, *right_padded(2, 12, [12, 9])).module()
    x, mask = right_padded(2, 5, [5, 3])  # T = 5 > s^(L-1) = 4: every level has two tokens or more
    torch.testing.assert_close(program(x, mask), layer(x, mask), rtol=0, atol=1e-12)
    with pytest.raises((AssertionError, RuntimeError), match="(?i)guard"):
        program(*right_padded(2, 4, [4, 3]))  # ceil(4 / 4) = 1 token at the top level


class WithImpl(torch.nn.Module):
    "`layer` called with a fixed `impl` (torch.jit.trace passes tensors only)."
    def __init__(self, layer, impl):
        super().__init__()
        self.layer, self.impl = layer, impl

    def forward(self, x, mask):
        return self.layer(x, mask, impl=self.impl)


@pytest.mark.parametrize("impl", ["fused", "explicit"])
def test_jit_trace_equals_eager_at_the_traced_length(impl, randomise, one_thread):
    layer = randomise(HierarchicalAttention(16, 4, n_levels=3)).double().eval()
    x, mask = right_padded(2, 13, [13, 8])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TracerWarnings: a trace is fixed to the control flow of its shapes
        traced = torch.jit.trace(WithImpl(layer, impl), (x, mask))
    x2, _ = right_padded(2, 13, [13, 8])
    torch.testing.assert_close(traced(x2, mask), layer(x2, mask, impl=impl), rtol=0, atol=1e-12)


@pytest.mark.parametrize("make", [lambda: HierarchicalAttention(16, 4, n_levels=3),
                                  lambda: HierarchicalAttention(16, 4, n_levels=3, causal=True),
                                  lambda: MultiHeadAttention(16, 4)], ids=["hkt", "hkt-causal", "mha"])
def test_vmap_over_a_batch_with_a_mask_equals_the_batched_call(make, one_thread):
    layer = make().double().eval()
    x, mask = right_padded(3, 13, [13, 8, 2])
    per_sample = torch.func.vmap(lambda a, m: layer(a[None], m[None])[0])(x, mask)
    torch.testing.assert_close(per_sample, layer(x, mask), rtol=0, atol=1e-12)


def test_vmap_of_the_classifier_and_per_sample_gradients(one_thread):
    cfg = ClassifierConfig(vocab_size=11, n_classes=3, max_len=32, d_model=16, n_heads=4, n_layers=1, dropout=0.0)
    model = HKTClassifier(cfg).double().eval()
    ids, mask = torch.randint(0, 11, (3, 13)), torch.arange(13)[None] >= torch.tensor([[13], [8], [2]])
    logits = torch.func.vmap(lambda i, m: model(i[None], m[None])[0])(ids, mask)
    torch.testing.assert_close(logits, model(ids, mask), rtol=0, atol=1e-12)
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, i, m):
        return torch.func.functional_call(model, p, (i[None], m[None]))[0].logsumexp(-1)

    grads = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(params, ids, mask)
    model.zero_grad()
    loss(dict(model.named_parameters()), ids[1], mask[1]).backward()
    weight = "blocks.0.attn.level_logits"
    torch.testing.assert_close(grads[weight][1], dict(model.named_parameters())[weight].grad, rtol=0, atol=1e-12)


def test_value_checks_run_in_eager_mode_only():
    mask = torch.zeros(2, 4, dtype=torch.bool)
    assert can_check_values(mask)
    seen = []
    torch.func.vmap(lambda m: seen.append(can_check_values(m)) or m)(mask)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.trace(lambda m: seen.append(can_check_values(m)) or m.float(), (mask,), check_trace=False)
    assert seen == [False, False]
    layer = HierarchicalAttention(16, 4)  # eager: a left-padded mask is refused with its reason
    with pytest.raises(ValueError, match="right padding"):
        layer(torch.randn(1, 4, 16), torch.tensor([[True, False, False, False]]))


# --- export over an explicit Dim range (issue 35, item 5) -------------------------------------------------------

def export_range(module, args, lo, hi):
    "`module` exported with the length axis (dim 1) of every argument one named `Dim('T', min=lo, max=hi)`."
    T = torch.export.Dim("T", min=lo, max=hi)
    return torch.export.export(module, args, dynamic_shapes=tuple({1: T} for _ in args)).module()


def three_lengths(lo, hi):
    "The ends and the middle of the range [lo, hi]."
    return lo, (lo + hi) // 2, hi


def check_layer_over_range(layer, lo, hi, masked=True):
    "Export `layer` over [lo, hi] and compare the program with eager at three lengths inside the range."
    def args(T):
        x, mask = right_padded(2, T, [T, max(T - 3, 1)])
        return (x, mask) if masked else (x,)
    program = export_range(layer, args((lo + hi) // 2), lo, hi)
    for T in three_lengths(lo, hi):
        inputs = args(T)
        torch.testing.assert_close(program(*inputs), layer(*inputs), rtol=0, atol=1e-12)


@pytest.mark.parametrize("level_count,stride", [(3, 2), (2, 3), (4, 2), (3, 3), (1, 2)])
def test_level_length_is_the_ceiling_at_every_length(level_count, stride):
    "The export-friendly form of T_l is ceil(T / s^l) for every T, on both sides of s^(L-1), and `level_lengths`."
    from hkt_nb.downsampling import level_length, level_lengths
    for T in range(1, 300):
        got = [level_length(T, l, stride, level_count) for l in range(level_count)]
        assert got == [-(-T // stride**l) for l in range(level_count)] == level_lengths(T, level_count, stride)


def test_exported_layer_over_the_issue_s_first_range_equals_eager(one_thread):
    "Dim('T', min=5, max=64): the range of issue 35 that failed with `(2 % (2*((1 + T) // 2))) != 0`."
    check_layer_over_range(HierarchicalAttention(16, 4, n_levels=3).double().eval(), 5, 64)


LAYER_RANGES = [  # (n_levels, stride, causal, kernel_size, min, max): min > stride^(n_levels-1)
    *[(3, 2, False, None, lo, 64) for lo in (7, 8, 9, 10, 17)],
    (3, 2, True, None, 5, 64), (3, 2, False, 3, 6, 33), (2, 3, False, None, 4, 50), (2, 3, True, 4, 5, 29),
    (4, 2, False, None, 9, 70), (3, 3, True, None, 10, 40), (3, 2, False, None, 23, 200),
]


@pytest.mark.slow
@pytest.mark.parametrize("n_levels,stride,causal,kernel_size,lo,hi", LAYER_RANGES)
def test_exported_layer_over_a_range_equals_eager(n_levels, stride, causal, kernel_size, lo, hi, randomise, one_thread):
    layer = HierarchicalAttention(16, 4, n_levels=n_levels, stride=stride, causal=causal, kernel_size=kernel_size)
    check_layer_over_range(randomise(layer).double().eval(), lo, hi)


@pytest.mark.slow
def test_exported_layer_without_a_mask_over_a_range_equals_eager(randomise, one_thread):
    check_layer_over_range(randomise(HierarchicalAttention(16, 4, n_levels=3)).double().eval(), 7, 40, masked=False)


@pytest.mark.parametrize("n_levels,stride,lo,hi", [(3, 2, 2, 64), (3, 2, 3, 64), (3, 2, 4, 64), (2, 3, 3, 30),
                                                   (2, 3, 2, 9), (4, 2, 8, 64), (3, 3, 9, 20)])
def test_a_range_reaching_a_one_token_level_is_a_clear_error(n_levels, stride, lo, hi, one_thread):
    "min <= s^(L-1): a ValueError names the valid range (min = s^(L-1) + 1) before torch's guards fire."
    import time
    layer = HierarchicalAttention(16, 4, n_levels=n_levels, stride=stride).double().eval()
    top = stride ** (n_levels - 1)
    start = time.perf_counter()
    with pytest.raises(ValueError) as info:
        export_range(layer, right_padded(2, max(lo, 2), [max(lo, 2), 1]), lo, hi)
    message = str(info.value)
    assert f"ranges over [{lo}, {hi}]" in message and f'Dim("T", min={top + 1}, max={hi})' in message, message
    assert f"T > stride^(n_levels-1) = {top}" in message, message
    assert time.perf_counter() - start < 30  # raised at the first step, not after torch's solver


@pytest.mark.parametrize("lo,hi", [(2, 64), (3, 17), (5, 64), (17, 64)])
def test_exported_mha_over_a_range_equals_eager(lo, hi, randomised_mha, one_thread):
    "Standard attention has no levels: every range of lengths >= 2 exports."
    layer = MultiHeadAttention(16, 4).double().eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    check_layer_over_range(layer, lo, hi)


def classifier(attention="hkt"):
    cfg = ClassifierConfig(vocab_size=11, n_classes=3, max_len=64, d_model=16, n_heads=4, n_layers=2, attention=attention)
    return HKTClassifier(cfg).double().eval()


def check_classifier_over_range(model, lo, hi):
    def args(T):
        return torch.randint(0, 11, (2, T)), torch.arange(T)[None] >= torch.tensor([[T], [max(T - 4, 1)]])
    program = export_range(model, args((lo + hi) // 2), lo, hi)
    for T in three_lengths(lo, hi):
        inputs = args(T)
        torch.testing.assert_close(program(*inputs), model(*inputs), rtol=0, atol=1e-12)


def test_exported_classifier_over_the_issue_s_range_equals_eager(one_thread):
    check_classifier_over_range(classifier(), 5, 64)


@pytest.mark.slow
@pytest.mark.parametrize("lo,hi", [(7, 64), (8, 64), (9, 64), (10, 64), (17, 64), (6, 20)])
def test_exported_classifier_over_a_range_equals_eager(lo, hi, one_thread):
    check_classifier_over_range(classifier(), lo, hi)


@pytest.mark.slow
def test_exported_mha_classifier_over_a_range_from_two_equals_eager(one_thread):
    check_classifier_over_range(classifier("mha"), 2, 64)


@pytest.mark.parametrize("lo,hi,text", [
    (2, 64, 'Dim("T", min=5, max=64)'), (4, 30, 'Dim("T", min=5, max=30)'),
    (5, 100, 'ranges over [5, 100], past max_len=64: export with Dim("T", min=5, max=64)'),
    (17, 65, "past max_len=64")])
def test_classifier_range_outside_its_valid_lengths_is_a_clear_error(lo, hi, text, one_thread):
    model = classifier()
    ids = torch.randint(0, 11, (2, min(max(lo, 2), 64)))
    with pytest.raises(ValueError) as info:
        export_range(model, (ids,), lo, hi)
    assert text in str(info.value), str(info.value)


def test_default_dynamic_range_is_not_refused():
    "Dim.DYNAMIC (range [2, oo], narrowed by torch itself) passes the check; an int (eager) too."
    from hkt_nb.downsampling import check_export_length, export_length_range
    assert export_length_range(7) is None and check_export_length(3, 3, 2) is None
    layer = HierarchicalAttention(16, 4, n_levels=3).double().eval()
    program = exported(layer, *right_padded(2, 12, [12, 9])).module()  # Dim.DYNAMIC: a program for T > 4
    x, mask = right_padded(2, 9, [9, 6])
    torch.testing.assert_close(program(x, mask), layer(x, mask), rtol=0, atol=1e-12)
