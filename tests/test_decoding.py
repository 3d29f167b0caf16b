"""Exact incremental decoding (issue 18, item 2; chapter *Incremental decoding*, nbs/02b_decoding): the cached
step-by-step outputs of a causal layer equal its full forward at every position, in float64, and one step does
O(T d) work with a cache that grows linearly. (A trained checkpoint's logits are checked with the language model.)"""
import math

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from hkt_nb.attention import HierarchicalAttention, MultiHeadAttention
from hkt_nb.decoding import HKTCache, KVCache, cached_forward, fused_weights, layer_cache, prefill, step

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


def test_the_coarse_levels_and_the_pyramid_state_matter(randomise):
    "The equality is not vacuous: dropping level 2's keys or the pyramid's windows (kernel 3 > stride) changes the outputs."
    layer = hkt(randomise, 3, 2, 3)
    x = torch.randn(1, 40, 16, dtype=torch.float64)
    full = layer(x)
    cache = layer_cache(layer, 1)
    prefill(layer, x[:, :20], cache)
    cache.keys[:, :, 8:12] = 0  # forget level 2's keys (head width d = 4: level 2 is features 8..11 of each row)
    cache.state[:, 1, :, 2] = 0
    assert (step(layer, x[:, 20:21], cache) - full[:, 20:21]).abs().max() > 1e-3
    cache = layer_cache(layer, 1)
    prefill(layer, x[:, :20], cache)
    for window in cache.windows:  # forget the downsampling convolutions' inputs: wrong once a block completes
        window.zero_()
    out = torch.cat([step(layer, x[:, i : i + 1], cache) for i in range(20, 24)], 1)
    assert (out - full[:, 20:24]).abs().max() > 1e-3


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
        # a level's query (and key) is zero exactly while it has no completed token; so is its block of key column j
        assert [bool(cache.state[:, :, :, l].abs().sum() == 0) for l in range(4)] == [T // 2**l == 0 for l in range(4)]
        blocks = cache.keys[..., cache.offset : cache.offset + T].unflatten(2, (4, 4))  # (B, H, L, d, T)
        empty = blocks.abs().sum((0, 1, 3)) == 0  # (L, T)
        assert torch.equal(empty, torch.tensor([[j + 1 < 2**l for j in range(T)] for l in range(4)]))


def linear_numel(B, D, T, n_levels, stride, kernel_size, conv_kernel_size):
    """Elements an HKT cache holds after T positions: a row of L key blocks and a value per position, the c - 1 zero
    values before the sequence, each level's query and key (the state) and the downsampling windows."""
    return B * D * ((n_levels + 1) * T + conv_kernel_size - 1 + 2 * n_levels + (n_levels - 1) * kernel_size)


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
    used = at_once.offset + 29
    pairs = [(at_once.keys[..., :used], stepped.keys[..., :used]), (at_once.values.view, stepped.values.view)]
    pairs += list(zip(at_once.windows, stepped.windows)) + [(at_once.state, stepped.state)]
    for a, b in pairs:
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_float32_layer_with_the_library_initialisation():
    "The default (float32, library-initialised) layer decodes to float32 rounding."
    layer = HierarchicalAttention(32, 4, 3, 2, causal=True).eval()
    x = torch.randn(2, 70, 32)
    torch.testing.assert_close(cached_forward(layer, x, 5), layer(x), rtol=0, atol=1e-5)


# --- the lean step and static shapes (issue 34) ----------------------------------------------------------------------

ISSUE_SHAPES = [(4, 3, 4, 3), (2, 2, None, 3), (5, 2, None, 5)]  # (n_levels, stride, kernel_size, conv_kernel_size)
CHUNKS = {1: [1, 3, 1, 8], 7: [7, 2, 5, 1], 40: [40, 1, 6]}  # prompt length -> uneven prefill chunks, then steps


@pytest.mark.parametrize("capacity", [None, 64])
@pytest.mark.parametrize("n_levels,stride,kernel_size,conv_kernel_size", ISSUE_SHAPES)
def test_issue_shapes_in_uneven_chunks(randomise, n_levels, stride, kernel_size, conv_kernel_size, capacity):
    "The shapes of issue 34, prompts of 1, 7 and 40 in uneven prefill chunks, batch 3, growing and fixed capacity."
    layer = hkt(randomise, n_levels, stride, kernel_size, conv_kernel_size=conv_kernel_size)
    x = torch.randn(3, 60, 16, dtype=torch.float64)  # 60 > s^(L-1) for L = 4, s = 3 (27) and L = 5, s = 2 (16)
    full = layer(x)
    for prompt, chunks in CHUNKS.items():
        cache, outs, start = layer_cache(layer, 3, capacity), [], 0
        for size in chunks:
            outs.append(prefill(layer, x[:, start : start + size], cache))
            start += size
        outs += [step(layer, x[:, i : i + 1], cache) for i in range(start, 60)]
        torch.testing.assert_close(torch.cat(outs, 1), full, rtol=0, atol=1e-12, msg=lambda m: f"prompt {prompt}: {m}")
        assert cache.length == 60 and cache.counts == [60 // stride**l for l in range(n_levels)]


@pytest.mark.parametrize("make", ["hkt", "mha"])
def test_fixed_capacity_equals_the_full_forward_and_refuses_to_overflow(randomise, make):
    layer = hkt(randomise, 3, 2, 3) if make == "hkt" else randomise(MultiHeadAttention(16, 4, causal=True).double()).eval()
    x = torch.randn(2, 33, 16, dtype=torch.float64)
    for P in (1, 5, 33):
        torch.testing.assert_close(cached_forward(layer, x, P, capacity=33), layer(x), rtol=0, atol=1e-12)
    cache = layer_cache(layer, 2, capacity=8)
    prefill(layer, x[:, :8], cache)
    assert cache.length == 8 and cache.capacity == 8
    with pytest.raises(ValueError, match="full"):
        step(layer, x[:, 8:9], cache)
    with pytest.raises(ValueError, match="full"):
        prefill(layer, x[:, :9], layer_cache(layer, 2, capacity=8))
    with pytest.raises(ValueError, match="capacity"):
        layer_cache(layer, 2, capacity=0)


def test_a_windowed_kv_cache_with_a_fixed_capacity(randomise):
    layer = randomise(MultiHeadAttention(16, 4, causal=True).double())
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    cache = layer_cache(layer, 2, capacity=12)
    cache.window = 3
    out = [prefill(layer, x[:, :1], cache)] + [step(layer, x[:, i : i + 1], cache) for i in range(1, 12)]
    for i in range(2, 12):
        torch.testing.assert_close(out[i], layer(x[:, i - 2 : i + 1])[:, -1:], rtol=0, atol=1e-12)


@pytest.mark.parametrize("capacity", [None, 20])
@pytest.mark.parametrize("make", ["hkt", "mha"])
def test_steps_from_an_empty_cache(randomise, make, capacity):
    "No prefill at all: the first step reads only the zeros before the sequence (the README's loop may start so)."
    layer = hkt(randomise, 3, 2, 3) if make == "hkt" else randomise(MultiHeadAttention(16, 4, causal=True).double()).eval()
    x = torch.randn(2, 20, 16, dtype=torch.float64)
    cache = layer_cache(layer, 2, capacity)
    out = torch.cat([step(layer, x[:, i : i + 1], cache) for i in range(20)], 1)
    torch.testing.assert_close(out, layer(x), rtol=0, atol=1e-12)


def test_folded_weights_follow_the_parameters(randomise):
    "The folded maps are reused while the parameters stay, and folded again after an in-place change."
    layer = hkt(randomise, 3, 2, None)
    first = fused_weights(layer)
    assert fused_weights(layer) is first
    with torch.no_grad():
        layer.level_logits.add_(0.5)
    assert fused_weights(layer) is not first
    x = torch.randn(1, 20, 16, dtype=torch.float64)
    torch.testing.assert_close(cached_forward(layer, x, 3), layer(x), rtol=0, atol=1e-12)


def compiled_decoding(layer, x, capacity, **compile_kw):
    "cached_forward with a compiled step, failing on any recompilation; (outputs, frames compiled)."
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(step, fullgraph=True, **compile_kw)
    with torch._dynamo.config.patch(error_on_recompile=True):
        out = cached_forward(layer, x, 5, capacity=capacity, step_fn=compiled)
    return out, counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("make", ["hkt", "mha"])
def test_a_compiled_step_does_not_recompile(randomise, make, one_thread):
    "200 steps of a fixed-capacity cache through one Dynamo graph (guards hold at every position; eager backend)."
    layer = hkt(randomise, 3, 2, 3) if make == "hkt" else randomise(MultiHeadAttention(16, 4, causal=True).double()).eval()
    x = torch.randn(2, 205, 16, dtype=torch.float64)
    out, graphs = compiled_decoding(layer, x, 205, backend="eager")
    assert graphs == 1
    torch.testing.assert_close(out, layer(x), rtol=0, atol=1e-12)


@pytest.mark.slow
def test_reduce_overhead_compiled_step_does_not_recompile(randomise, one_thread):
    "The same under torch.compile(mode='reduce-overhead') (Inductor; CUDA graphs where there is a GPU): minutes on a CPU."
    layer = hkt(randomise, 3, 2, 3, D=8, H=2)
    x = torch.randn(1, 205, 8, dtype=torch.float64)
    out, graphs = compiled_decoding(layer, x, 205, mode="reduce-overhead")
    assert graphs == 1
    torch.testing.assert_close(out, layer(x), rtol=0, atol=1e-12)


# --- a cache remembers what it was computed with (issue 35, item 6) --------------------------------------------------

def _filled(randomise, make, capacity=None):
    "A causal layer (float64), its cache prefilled with 5 positions, and the next token."
    layer = hkt(randomise, 3, 2, None) if make == "hkt" else randomise(
        MultiHeadAttention(16, 4, causal=True).double()).eval()
    cache = layer_cache(layer, 2, capacity=capacity)
    prefill(layer, torch.randn(2, 5, 16, dtype=torch.float64), cache)
    return layer, cache, torch.randn(2, 1, 16, dtype=torch.float64)


@pytest.mark.parametrize("make", ["hkt", "mha"])
@pytest.mark.parametrize("capacity", [None, 12])
@pytest.mark.parametrize("change", ["float", "bfloat16"])
def test_a_cache_refuses_a_layer_moved_to_another_dtype(randomise, make, capacity, change):
    layer, cache, x = _filled(randomise, make, capacity)
    getattr(layer, change)()
    for fn, arg in ((step, x), (prefill, torch.randn(2, 3, 16))):
        with pytest.raises(ValueError, match=r"the cache was made in torch.float64 on cpu, the layer is now torch\."):
            fn(layer, arg.to(layer.out_proj.weight.dtype), cache)


@pytest.mark.parametrize("make", ["hkt", "mha"])
@pytest.mark.parametrize("how", ["in place", "load_state_dict", "optimiser step"])
def test_a_cache_refuses_parameters_changed_after_it_was_filled(randomise, make, how):
    layer, cache, x = _filled(randomise, make)
    if how == "in place":
        with torch.no_grad():
            layer.out_proj.weight.mul_(1.5)
    elif how == "load_state_dict":
        layer.load_state_dict({k: v + 0.1 for k, v in layer.state_dict().items()})
    else:
        layer.train()
        opt = torch.optim.SGD(layer.parameters(), lr=0.1)
        layer(torch.randn(2, 6, 16, dtype=torch.float64)).sum().backward()
        opt.step()
        layer.eval()
    with pytest.raises(ValueError, match="parameters changed since this cache was made .*out_proj.weight"):
        step(layer, x, cache)


@pytest.mark.parametrize("make", ["hkt", "mha"])
def test_a_cache_is_tied_to_the_parameters_it_was_made_with(randomise, make):
    "An HKT cache holds the layer's folded maps from the start: a change even before the first prefill is refused."
    layer = hkt(randomise, 3, 2, None) if make == "hkt" else randomise(
        MultiHeadAttention(16, 4, causal=True).double()).eval()
    cache = layer_cache(layer, 1)
    with torch.no_grad():
        layer.out_proj.weight.mul_(0.5)
    x = torch.randn(1, 9, 16, dtype=torch.float64)
    with pytest.raises(ValueError, match="parameters changed since this cache was made"):
        prefill(layer, x[:, :4], cache)
    cache = layer_cache(layer, 1)  # a new cache: exact again
    out = torch.cat([prefill(layer, x[:, :4], cache)] + [step(layer, x[:, t:t + 1], cache) for t in range(4, 9)], 1)
    torch.testing.assert_close(out, layer(x), rtol=0, atol=1e-12)
