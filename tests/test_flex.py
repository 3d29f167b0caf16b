"""Tests of hkt_nb.experimental.flex, the experimental FlexAttention form of HKT (impl="flex"): its forward pass equals
the explicit form on the CPU (FlexAttention's CPU forward), masks, causal mode and level counts included. Its backward
pass and speed exist only on CUDA and are measured by `make gpu-check` (tests/test_cuda.py, scripts/gpu_check.py)."""
import pytest
import torch

from hkt_nb import HierarchicalAttention

flex = pytest.importorskip("torch.nn.attention.flex_attention")


@pytest.mark.parametrize("n_levels", [1, 2, 3, 4])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("T", [16, 37])  # a multiple of s^(L-1) and not
def test_flex_forward_equals_explicit(n_levels, causal, masked, T):
    torch.manual_seed(n_levels + 10 * causal)
    layer = HierarchicalAttention(16, 2, n_levels=n_levels, causal=causal).eval()
    with torch.no_grad():
        layer.level_logits.normal_()  # unequal level weights, per head
        layer.gate_logits.normal_()
    x = torch.randn(3, T, 16)
    mask = None
    if masked:
        mask = torch.zeros(3, T, dtype=torch.bool)
        mask[1, T - 5:] = True
        mask[2, 3:] = True
    with torch.no_grad():
        got, want = layer(x, mask, impl="flex"), layer(x, mask, impl="explicit")
    real = torch.ones(3, T, dtype=torch.bool) if mask is None else ~mask
    torch.testing.assert_close(got[real], want[real], rtol=1e-4, atol=1e-5)
    assert torch.isfinite(got).all()  # padded queries too


def test_flex_refuses_attention_dropout_in_training():
    layer = HierarchicalAttention(16, 2, dropout=0.1).train()
    with pytest.raises(ValueError, match="^impl"):
        layer(torch.randn(1, 8, 16), impl="flex")
    with torch.no_grad():
        layer.eval()(torch.randn(1, 8, 16), impl="flex")  # evaluation: dropout is off, flex runs


def test_flex_on_cpu_is_forward_only():
    "FlexAttention in this torch has no CPU backward: a graph that needs gradients is refused, not silently wrong."
    with pytest.raises(NotImplementedError, match="backward"):  # torch's own refusal
        HierarchicalAttention(16, 2).eval()(torch.randn(1, 8, 16), impl="flex")


def test_flex_is_reached_by_name_and_imported_on_first_use():
    import subprocess
    import sys
    code = ("import sys, torch\nfrom hkt_nb import HierarchicalAttention\nassert 'hkt_nb.experimental.flex' not in sys.modules\n"
            "with torch.no_grad():\n    HierarchicalAttention(8, 2).eval()(torch.randn(1, 4, 8), impl='flex')\n"
            "assert 'hkt_nb.experimental.flex' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_unknown_impl_names_flex():
    with pytest.raises(ValueError, match="^impl.*flex"):
        HierarchicalAttention(16, 2)(torch.randn(1, 8, 16), impl="sdpa")


@pytest.mark.parametrize("causal", [False, True])
def test_flex_nan_in_padding_does_not_reach_real_tokens(causal):
    layer = HierarchicalAttention(16, 2, n_levels=3, causal=causal).eval()
    x = torch.randn(2, 13, 16)
    mask = torch.arange(13)[None] >= torch.tensor([[13], [7]])
    dirty = x.clone()
    dirty[1, 7:10], dirty[1, 10:] = float("nan"), float("inf")
    with torch.no_grad():
        got, want = layer(dirty, mask, impl="flex"), layer(x.masked_fill(mask[..., None], 0.0), mask, impl="flex")
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got[~mask], want[~mask], rtol=0, atol=0)
