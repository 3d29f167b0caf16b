"""The CUDA checks of issue 12 (marker `cuda`), run by `make gpu-check` on a GPU: fused == explicit in float32,
finite bfloat16 / float16 training steps, the SDPA backend used (flash or memory-efficient, never math) and
memory linear in T up to 16,384. Skipped without a GPU; `scripts/gpu_check.py --dry-run` runs them on the CPU at
toy size (HKT_TEST_DEVICE=cpu, HKT_GPU_CHECK_MAX_T) so that they cannot rot. Measurements are written as JSON
under $HKT_GPU_CHECK_OUT when it is set."""
import json
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from hkt_nb import (
    ClassifierConfig,
    HierarchicalAttention,
    HKTClassifier,
    MultiHeadAttention,
)
from hkt_nb.cost import saved_tensor_bytes

pytestmark = pytest.mark.cuda
DEVICE = torch.device(os.environ.get("HKT_TEST_DEVICE", "cuda"))
MAX_T = int(os.environ.get("HKT_GPU_CHECK_MAX_T", 16384))
TOY = DEVICE.type != "cuda"  # the dry run: every size divided so that the file runs in seconds on a CPU
D, H, T_STEP = (16, 2, 32) if TOY else (64, 4, 256)
if DEVICE.type == "cuda" and not torch.cuda.is_available():
    pytest.skip("no CUDA device (set HKT_TEST_DEVICE=cpu for the dry run)", allow_module_level=True)


def record(name: str, values: dict) -> None:
    "Write a measurement to $HKT_GPU_CHECK_OUT/<name>.json (nothing when unset)."
    if os.environ.get("HKT_GPU_CHECK_OUT"):
        path = Path(os.environ["HKT_GPU_CHECK_OUT"]) / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"device": str(DEVICE), **values}, indent=1) + "\n")


@pytest.fixture(autouse=True)
def exact_float32():
    "No TF32 in matmuls or convolutions (it would hide a 1e-3 difference between the two forms)."
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def padded_batch(B=3, T=40 if TOY else 200, D=D):
    x = torch.randn(B, T, D, device=DEVICE)
    mask = torch.zeros(B, T, dtype=torch.bool, device=DEVICE)
    mask[1, T - T // 5:] = True
    mask[B - 1, T // 3:] = True
    return x, mask


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_fused_equals_explicit_float32(causal, masked):
    layer = HierarchicalAttention(D, H, n_levels=3, causal=causal).to(DEVICE).eval()
    x, mask = padded_batch()
    mask = mask if masked else None
    with torch.no_grad():
        fused, explicit = layer(x, mask, impl="fused"), layer(x, mask, impl="explicit")
    real = ~mask if masked else torch.ones(x.shape[:2], dtype=torch.bool, device=DEVICE)
    error = (fused - explicit)[real].abs().max().item()
    record(f"fused_vs_explicit_causal{int(causal)}_mask{int(masked)}", {"max_abs_error": error})
    torch.testing.assert_close(fused[real], explicit[real], rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("dtype", [torch.float16] if TOY else [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("attention", ["hkt", "mha"])
def test_mixed_precision_training_steps_are_finite(dtype, attention):
    torch.manual_seed(0)
    config = ClassifierConfig(vocab_size=20, n_classes=4, max_len=T_STEP, d_model=D, n_heads=H, n_layers=2,
                              attention=attention)
    model = HKTClassifier(config).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(DEVICE.type, enabled=dtype == torch.float16)
    ids = torch.randint(0, 20, (8, T_STEP), device=DEVICE)
    mask = torch.arange(T_STEP, device=DEVICE)[None, :] >= torch.randint(T_STEP // 4, T_STEP + 1, (8, 1), device=DEVICE)
    labels = torch.randint(0, 4, (8,), device=DEVICE)
    losses, scales = [], []
    for _ in range(6):
        with torch.autocast(DEVICE.type, dtype=dtype):
            loss = F.cross_entropy(model(ids, mask).float(), labels)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)  # float16: a step with an overflowing gradient is skipped and the scale halved
        scaler.update()
        losses.append(loss.item())
        scales.append(scaler.get_scale() if scaler.is_enabled() else 1.0)
    record(f"amp_steps_{attention}_{str(dtype).split('.')[-1]}", {"losses": losses, "loss_scales": scales})
    assert all(torch.isfinite(torch.tensor(losses)))
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert scales[-1] == scales[-2]  # the scale has settled: the last step was taken


def _fast_backends() -> list:
    "Flash and memory-efficient attention only (the math kernel, which materialises T x T, is excluded)."
    return [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION] if DEVICE.type == "cuda" else [
        SDPBackend.FLASH_ATTENTION]


@pytest.mark.parametrize("dtype", [torch.float32] if TOY else [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("attention", ["hkt", "mha"])
def test_sdpa_runs_on_a_fast_kernel(attention, masked, dtype):
    if DEVICE.type == "cuda" and dtype == torch.bfloat16 and torch.cuda.get_device_capability(DEVICE) < (8, 0):
        pytest.skip("no native bfloat16 below compute capability 8.0 (amp='auto' picks float16 there)")
    width = D if TOY else 128
    layer = (HierarchicalAttention(width, H) if attention == "hkt" else MultiHeadAttention(width, H)).to(DEVICE, dtype)
    x, mask = padded_batch(B=2, T=min(1024, MAX_T), D=width)
    x = x.to(dtype).requires_grad_()
    with sdpa_kernel(_fast_backends()):  # raises if no allowed kernel accepts the call
        layer(x, mask if masked else None).float().sum().backward()
    assert torch.isfinite(x.grad).all()


def _peak_bytes(layer, T: int) -> int:
    x = torch.randn(1, T, layer.d_model, device=DEVICE, requires_grad=True)
    if DEVICE.type != "cuda":  # the dry run: bytes saved for backward (deterministic proxy)
        return saved_tensor_bytes(layer, x)[1]
    torch.cuda.synchronize(DEVICE)
    torch.cuda.reset_peak_memory_stats(DEVICE)
    base = torch.cuda.memory_allocated(DEVICE)
    layer(x).sum().backward()
    torch.cuda.synchronize(DEVICE)
    return torch.cuda.max_memory_allocated(DEVICE) - base


@pytest.mark.parametrize("attention", ["hkt", "mha"])
def test_memory_is_linear_in_length(attention):
    width = D if TOY else 128
    layer = (HierarchicalAttention(width, H) if attention == "hkt" else MultiHeadAttention(width, H)).to(DEVICE)
    lengths = [T for T in (64, 256, 1024, 4096, 16384) if T <= MAX_T][-3:]
    peaks = {T: _peak_bytes(layer, T) for T in lengths}
    per_token = {T: peaks[T] / T for T in lengths}
    record(f"memory_{attention}", {"peak_bytes": peaks, "bytes_per_token": per_token,
                                   "measure": "torch.cuda.max_memory_allocated increase, fwd + bwd, B=1, D=128, H=4"
                                   if DEVICE.type == "cuda" else "saved_tensor_bytes (dry run)"})
    # O(T): bytes per token stay within 1.5x from the first length to the last (quadratic: x (T_max / T_min))
    assert per_token[lengths[-1]] <= 1.5 * per_token[lengths[0]]


def _step_seconds(layer, x, mask, impl, repeats=10) -> float:
    "Median seconds of one forward + backward (CUDA events)."
    times = []
    for i in range(repeats + 2):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        layer(x, mask, impl=impl).float().sum().backward()
        end.record()
        torch.cuda.synchronize(DEVICE)
        if i >= 2:  # two warm-up steps (the first compiles the flex kernel)
            times.append(start.elapsed_time(end) / 1000)
    return sorted(times)[len(times) // 2]


def test_flex_form_gradients_and_speed():
    "impl='flex' (experimental): gradients equal the explicit form's on CUDA; its time against fused HKT and MHA."
    pytest.importorskip("torch.nn.attention.flex_attention")
    layer = HierarchicalAttention(D, H).to(DEVICE)
    x, mask = padded_batch()
    real = ~mask
    if DEVICE.type != "cuda":  # the dry run: FlexAttention has no CPU backward, check the forward pass only
        with torch.no_grad():
            torch.testing.assert_close(layer(x, mask, impl="flex")[real], layer(x, mask, impl="explicit")[real],
                                       rtol=1e-4, atol=1e-5)
        return
    grads = {}
    for impl in ("explicit", "flex"):
        layer.zero_grad()
        inputs = x.clone().requires_grad_()
        (layer(inputs, mask, impl=impl)[real] ** 2).sum().backward()
        grads[impl] = [inputs.grad] + [p.grad.clone() for p in layer.parameters()]
    errors = [(a - b).abs().max().item() for a, b in zip(grads["explicit"], grads["flex"])]
    timing = {}
    big = torch.randn(4, 4096, 128, device=DEVICE, requires_grad=True)
    hkt, mha = HierarchicalAttention(128, 4).to(DEVICE), MultiHeadAttention(128, 4).to(DEVICE)
    for name, module, impl in (("hkt_fused", hkt, "fused"), ("hkt_flex", hkt, "flex"), ("mha", mha, "fused")):
        timing[name] = _step_seconds(module, big, None, impl)
    record("flex", {"max_abs_grad_error": max(errors), "fwd_bwd_seconds_B4_T4096_D128_H4_fp32": timing})
    for a, b in zip(grads["explicit"], grads["flex"]):
        torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-4)
