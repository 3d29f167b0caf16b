"""Exact incremental decoding (issue 18, item 2; chapter *Incremental decoding*, nbs/02b_decoding): the cached
step-by-step outputs of a causal layer equal its full forward at every position, in float64, and one step does
O(T d) work with a cache that grows linearly. (A trained checkpoint's logits are checked with the language model.)"""
import math

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from hkt_nb.attention import HierarchicalAttention, MultiHeadAttention
from hkt_nb.decoding import GrowingBuffer, HKTCache, KVCache, cached_forward, layer_cache, prefill, step

CONFIGS = [(1, 2, None), (2, 2, None), (3, 2, None), (3, 3, None), (3, 2, 4), (4, 2, 3)]  # (n_levels, stride, kernel_size)
PROMPTS = [1, 2, 7, 33]


def hkt(randomise, n_levels, stride, kernel_size, D=16, H=4, conv_kernel_size=3):
    "A float64 causal HKT layer with every parameter random: biases, level and gate logits, convolutions."
    layer = HierarchicalAttention(D, H, n_levels, stride, causal=True, kernel_size=kernel_size,
                                  conv_kernel_size=conv_kernel_size).double()
    return randomise(layer).eval()


@pytest.mark.parametrize("n_levels,stride,kernel_size", CONFIGS)
def test_cached_decoding_equals_the_full_forward(randomise, n_levels, stride, kernel_size):
    layer = hkt(randomise, n_levels, stride, kernel_size)
    x = torch.randn(3, 80, 16, dtype=torch.float64)  # T = 80 crosses blocks of every level (s^3 = 8, 27)
    full = layer(x)
    for prompt_length in PROMPTS:
        cached = cached_forward(layer, x, prompt_length)
        assert cached.shape == full.shape
        torch.testing.assert_close(cached, full, rtol=0, atol=1e-12, msg=f"prompt length {prompt_length}")


@pytest.mark.parametrize("T", [1, 2, 3, 5, 9, 17])
def test_short_sequences_and_incomplete_blocks(randomise, T):
    "Positions inside the first, incomplete blocks of every level (no coarse token yet) and T = 1."
    layer = hkt(randomise, 4, 2, 3)
    x = torch.randn(2, T, 16, dtype=torch.float64)
    torch.testing.assert_close(cached_forward(layer, x, 1), layer(x), rtol=0, atol=1e-12)
    torch.testing.assert_close(cached_forward(layer, x, T), layer(x), rtol=0, atol=1e-12)


@pytest.mark.parametrize("conv_kernel_size", [1, 2, 5])
def test_value_convolution_widths(randomise, conv_kernel_size):
    layer = hkt(randomise, 3, 2, None, conv_kernel_size=conv_kernel_size)
    x = torch.randn(2, 30, 16, dtype=torch.float64)
    torch.testing.assert_close(cached_forward(layer, x, 4), layer(x), rtol=0, atol=1e-12)


def test_the_coarse_levels_and_the_convolution_matter(randomise):
    "The equality is not vacuous: dropping the coarse levels or the convolution state changes the outputs."
    layer = hkt(randomise, 3, 2, None)
    x = torch.randn(1, 40, 16, dtype=torch.float64)
    full = layer(x)
    cache = layer_cache(layer, 1)
    prefill(layer, x[:, :20], cache)
    cache.keys[2] = GrowingBuffer((1, 4), 4, torch.float64)  # forget level 2's completed keys
    cache.queries[2] = None
    assert (step(layer, x[:, 20:21], cache) - full[:, 20:21]).abs().max() > 1e-3
    cache = layer_cache(layer, 1)
    prefill(layer, x[:, :20], cache)
    cache.value_window.zero_()  # forget the hybrid head's convolution state
    assert (step(layer, x[:, 20:21], cache) - full[:, 20:21]).abs().max() > 1e-3


def test_mha_kv_cache_equals_the_full_forward(randomise):
    layer = randomise(MultiHeadAttention(16, 4, causal=True).double()).eval()
    x = torch.randn(3, 50, 16, dtype=torch.float64)
    full = layer(x)
    for prompt_length in PROMPTS:
        torch.testing.assert_close(cached_forward(layer, x, prompt_length), full, rtol=0, atol=1e-12)


def test_prefill_on_a_filled_cache_steps(randomise):
    "A second prefill (a chunk) continues the cache: chunks of 5, 1 and 14 positions give the full forward."
    layer = hkt(randomise, 3, 2, 3)
    x = torch.randn(2, 20, 16, dtype=torch.float64)
    cache = layer_cache(layer, 2)
    out = torch.cat([prefill(layer, x[:, :5], cache), prefill(layer, x[:, 5:6], cache), prefill(layer, x[:, 6:], cache)], 1)
    torch.testing.assert_close(out, layer(x), rtol=0, atol=1e-12)
    assert cache.length == 20 and cache.counts == [20, 10, 5]


def test_cache_holds_the_completed_tokens_only(randomise):
    layer = hkt(randomise, 4, 2, 3)
    x = torch.randn(2, 45, 16, dtype=torch.float64)
    for T in (1, 7, 8, 45):
        cache = layer_cache(layer, 2)
        prefill(layer, x[:, :T], cache)
        assert cache.counts == [T // 2**l for l in range(4)]
        assert [q is None for q in cache.queries[1:]] == [T // 2**l == 0 for l in range(1, 4)]


def linear_numel(B, D, T, n_levels, stride, kernel_size, conv_kernel_size):
    "Elements an HKT cache holds after T positions: fine keys and values, completed coarse keys, queries, windows."
    coarse = sum(T // stride**l for l in range(1, n_levels))
    queries = sum(T // stride**l > 0 for l in range(1, n_levels))
    return B * D * (2 * T + coarse + queries + (n_levels - 1) * kernel_size + conv_kernel_size - 1)


def test_cache_grows_linearly(randomise):
    layer = hkt(randomise, 3, 2, 4)
    x = torch.randn(2, 160, 16, dtype=torch.float64)
    for T in (40, 80, 160):
        cache = layer_cache(layer, 2)
        prefill(layer, x[:, :T], cache)
        assert cache.numel() == linear_numel(2, 16, T, 3, 2, 4, 3)
    kv = layer_cache(randomise(MultiHeadAttention(16, 4, causal=True).double()), 2)
    assert isinstance(kv, KVCache) and isinstance(cache, HKTCache)


class TensorSizes(TorchFunctionMode):
    "Records the shape of every tensor that a torch function returns while the mode is on."

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.shapes += [tuple(t.shape) for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        return out


def step_shapes(layer, x, T):
    "Shapes of the tensors made by the step at position T (after a prefill of T positions)."
    cache = layer_cache(layer, x.shape[0])
    prefill(layer, x[:, :T], cache)
    with TensorSizes() as sizes:
        step(layer, x[:, T : T + 1], cache)
    return sizes.shapes


@pytest.mark.parametrize("make", ["hkt", "mha"])
def test_a_step_does_linear_work(randomise, make):
    "No tensor with two axes of length >= T (no T x T map), and 4x the context costs at most ~4x the elements."
    layer = hkt(randomise, 3, 2, None, D=8, H=2) if make == "hkt" else \
        randomise(MultiHeadAttention(8, 2, causal=True).double()).eval()
    x = torch.randn(1, 600, 8, dtype=torch.float64)
    work = {}
    for T in (128, 512):
        shapes = step_shapes(layer, x, T)
        assert all(sum(n >= T for n in shape) <= 1 for shape in shapes), [s for s in shapes if sum(n >= T for n in s) > 1]
        work[T] = sum(math.prod(shape) for shape in shapes)
    assert work[512] <= 4.5 * work[128], work
    assert work[512] >= 2 * work[128], work  # it does grow with T: the step reads the whole context


def test_errors_name_the_argument(randomise):
    layer = hkt(randomise, 2, 2, None)
    with pytest.raises(ValueError, match="causal"):
        layer_cache(HierarchicalAttention(16, 4, causal=False), 1)
    with pytest.raises(TypeError, match="layer must be"):
        layer_cache(torch.nn.Linear(4, 4), 1)
    with pytest.raises(ValueError, match="batch_size"):
        layer_cache(layer, 0)
    cache = layer_cache(layer, 2)
    with pytest.raises(ValueError, match="batch size"):
        step(layer, torch.randn(3, 1, 16, dtype=torch.float64), cache)
    with pytest.raises(ValueError, match=r"\(B, 1, D\)"):
        step(layer, torch.randn(2, 2, 16, dtype=torch.float64), cache)
    with pytest.raises(ValueError, match="this very layer"):
        step(hkt(randomise, 2, 2, None), torch.randn(2, 1, 16, dtype=torch.float64), cache)
    with pytest.raises(TypeError, match="dtype"):
        step(layer, torch.randn(2, 1, 16), cache)
    with pytest.raises(ValueError, match="prompt_length"):
        cached_forward(layer, torch.randn(2, 4, 16, dtype=torch.float64), 5)
    dropping = HierarchicalAttention(16, 4, causal=True, dropout=0.1).double()
    with pytest.raises(ValueError, match="eval"):
        step(dropping, torch.randn(1, 1, 16, dtype=torch.float64), layer_cache(dropping, 1))


def test_a_subclass_does_not_inherit_its_parents_cache(randomise):
    "A subclass may change what a position reads (a sliding window does): it needs its own entry in CACHES."
    class Banded(MultiHeadAttention):
        pass

    with pytest.raises(TypeError, match="Banded"):
        layer_cache(Banded(16, 4, causal=True), 1)
    assert type(layer_cache(MultiHeadAttention(16, 4, causal=True), 1)) is KVCache


def test_a_windowed_kv_cache_attends_the_newest_keys(randomise):
    "KVCache.window = w: a step reads the newest w keys only, the causal band i - w < j <= i."
    layer = randomise(MultiHeadAttention(16, 4, causal=True).double())
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    cache = layer_cache(layer, 2)
    cache.window = 3
    out = [prefill(layer, x[:, :1], cache)] + [step(layer, x[:, i : i + 1], cache) for i in range(1, 12)]
    for i in range(2, 12):  # position i reads positions i - 2 .. i: the layer on that slice, at its last position
        torch.testing.assert_close(out[i], layer(x[:, i - 2 : i + 1])[:, -1:], rtol=0, atol=1e-12)


@pytest.mark.parametrize("n_levels,stride,kernel_size", [(3, 2, None), (4, 2, 3), (3, 3, 5)])
def test_prefill_builds_the_state_that_steps_build(randomise, n_levels, stride, kernel_size):
    "The cache read off a prompt equals the cache built by stepping through it, tensor by tensor."
    layer = hkt(randomise, n_levels, stride, kernel_size)
    x = torch.randn(2, 29, 16, dtype=torch.float64)
    at_once, stepped = layer_cache(layer, 2), layer_cache(layer, 2)
    prefill(layer, x, at_once)
    prefill(layer, x[:, :1], stepped)
    prefill(layer, x[:, 1:], stepped)  # a filled cache: one step per token
    assert at_once.length == stepped.length == 29 and at_once.counts == stepped.counts
    pairs = [(a.view, b.view) for a, b in zip(at_once.keys, stepped.keys)] + [(at_once.values.view, stepped.values.view)]
    pairs += list(zip(at_once.windows, stepped.windows)) + [(at_once.value_window, stepped.value_window)]
    pairs += [(a, b) for a, b in zip(at_once.queries[1:], stepped.queries[1:])]
    for a, b in pairs:
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_float32_layer_with_the_library_initialisation():
    "The default (float32, library-initialised) layer decodes to float32 rounding."
    layer = HierarchicalAttention(32, 4, 3, 2, causal=True).eval()
    x = torch.randn(2, 70, 32)
    torch.testing.assert_close(cached_forward(layer, x, 5), layer(x), rtol=0, atol=1e-5)
