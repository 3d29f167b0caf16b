"""The byte-level language model of chapter 15 (`hkt_nb.lm`, issue 18 items 1 to 3): causality of every variant,
the tied head, the weight-decay groups, the restorable initialisation, a known-answer training run, greedy
generation, the record, and cached decoding (`CachedDecoder`): its logits equal the full forward's in float64 for
random and trained weights, and cached generation equals recomputed generation token for token past max_len; the byte n-gram baselines
(known answers, proper distributions, a slow reference, the window-start rule, the record)."""
import math
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch import nn

from hkt_nb.attention import HierarchicalAttention, MultiHeadAttention
from hkt_nb.lm import (
    LM_MODELS,
    LM_PRESETS,
    ByteLM,
    LMConfig,
    CachedDecoder,
    LMTrainConfig,
    RecomputeDecoder,
    SlidingWindowAttention,
    WindowKVCache,
    compare_lm,
    configure_optimizer,
    count_lm_parameters,
    counted_lm_verdict,
    default_decoder,
    eval_windows,
    fit_byte_ngram,
    fit_ngram_baselines,
    generate,
    imdb_bytes,
    interpolated_ngram_probability,
    lm_learned_the_task,
    lm_model_config,
    load_record,
    lr_at,
    ngram_baselines,
    ngram_bits_per_byte,
    ngram_distribution,
    ngram_window_counts,
    run_lm,
    save_record,
    train_lm,
    window_mask,
)
from hkt_nb.decoding import KVCache, cached_forward, layer_cache
from hkt_nb.model import get_attention_variant, register_attention

VARIANTS = [("mha", {}), ("mha_window", {"window": 5}), ("hkt", {"n_levels": 1}), ("hkt", {"n_levels": 3}),
            ("hkt", {"n_levels": 3, "stride": 3, "kernel_size": 4})]


def tiny(attention="hkt", params=None, **kw) -> LMConfig:
    return LMConfig(**{"d_model": 16, "n_heads": 2, "n_layers": 2, "max_len": 64, "attention": attention,
                       "attention_params": params or {}, **kw})


@pytest.mark.parametrize("attention, params", VARIANTS)
@pytest.mark.parametrize("T", [1, 37, 64])
def test_logits_at_t_do_not_depend_on_later_bytes(attention, params, T, one_thread):
    torch.manual_seed(0)
    model = ByteLM(tiny(attention, params)).double().eval()
    with torch.no_grad():
        for _ in range(3):  # random non-trivial logits and gates (the init has gates 1/2, lambdas 1/L)
            for p in model.parameters():
                p.add_(0.3 * torch.randn_like(p))
    x = torch.randint(0, 256, (2, T))
    logits = model(x)
    for t in sorted({0, T // 2, T - 1}):
        changed = x.clone()
        changed[:, t + 1:] = torch.randint(0, 256, changed[:, t + 1:].shape)
        assert torch.allclose(model(changed)[:, : t + 1], logits[:, : t + 1], atol=1e-12, rtol=0), (t, T)
        prefix = model(x[:, : t + 1])  # a prefix alone: the same logits
        assert torch.allclose(prefix, logits[:, : t + 1], atol=1e-12, rtol=0)


def test_window_mask_is_the_band():
    m = window_mask(6, 3)
    for i in range(6):
        for j in range(6):
            assert bool(m[i, j]) == (i - 2 <= j <= i)
    assert torch.equal(window_mask(6, 3, causal=False), (torch.arange(6)[:, None] - torch.arange(6)).abs() < 3)


def test_sliding_window_equals_standard_attention_when_the_window_covers_the_sequence():
    x = torch.randn(2, 11, 8, dtype=torch.float64)
    window = SlidingWindowAttention(8, 2, causal=True, window=11).double()
    full = MultiHeadAttention(8, 2, causal=True).double()
    full.load_state_dict(window.state_dict())
    assert torch.allclose(window(x), full(x), atol=1e-12)
    window.window = 4  # and the fused form equals the explicit one, output at i reads only i-3 .. i
    assert torch.allclose(window(x), window(x, impl="explicit"), atol=1e-12)
    assert torch.allclose(window(x)[:, 6:], window(x[:, 3:])[:, 3:], atol=1e-12)


def test_sliding_window_with_padding_is_finite():
    layer = SlidingWindowAttention(8, 2, causal=True, window=2).double()
    x = torch.randn(1, 7, 8, dtype=torch.float64)
    mask = torch.tensor([[False] * 3 + [True] * 4])
    out = layer(x, mask)
    assert torch.isfinite(out).all()
    assert torch.allclose(out[:, :3], layer(x[:, :3]), atol=1e-12)


def test_registry_builds_each_variant_causal():
    assert isinstance(ByteLM(tiny("hkt", {"n_levels": 2})).blocks[0].attn, HierarchicalAttention)
    assert isinstance(ByteLM(tiny("mha")).blocks[0].attn, MultiHeadAttention)
    layer = ByteLM(tiny("mha_window", {"window": 7})).blocks[0].attn
    assert isinstance(layer, SlidingWindowAttention) and layer.window == 7
    assert all(block.attn.causal for block in ByteLM(tiny()).blocks)
    assert get_attention_variant("mha_window").params().window >= 1


def test_tied_head():
    model = ByteLM(tiny())
    assert model.head.weight is model.tok_emb.weight
    names = [n for n, _ in model.named_parameters()]
    assert "head.weight" not in names and "tok_emb.weight" in names
    assert count_lm_parameters(model) == sum(p.numel() for p in model.parameters())
    assert count_lm_parameters(tiny()) == count_lm_parameters(model)  # the meta-device count


def intended_no_decay(model: nn.Module) -> set[str]:
    "Written independently of the library's rule: biases, LayerNorm weights, level and gate logits."
    names = set()
    for name, p in model.named_parameters():
        owner = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
        last = name.rsplit(".", 1)[-1]
        if last == "bias" or isinstance(owner, nn.LayerNorm) or last in ("level_logits", "gate_logits"):
            names.add(name)
    return names


@pytest.mark.parametrize("attention, params", VARIANTS)
def test_no_weight_decay_and_optimiser_groups(attention, params):
    model = ByteLM(tiny(attention, params))
    exempt = model.no_weight_decay()
    assert exempt == intended_no_decay(model)
    if attention == "hkt":
        assert {"blocks.0.attn.level_logits", "blocks.1.attn.gate_logits"} <= exempt
        assert "blocks.0.attn.pyramid.down.0.depthwise.bias" in exempt or params.get("n_levels") == 1
    assert "tok_emb.weight" not in exempt and "pos_emb.weight" not in exempt  # decayed: see the chapter
    optimizer = configure_optimizer(model, 1e-3, 0.1, (0.9, 0.95))
    decayed, kept = optimizer.param_groups
    assert decayed["weight_decay"] == 0.1 and kept["weight_decay"] == 0.0 and optimizer.defaults["betas"] == (0.9, 0.95)
    ids = [id(p) for g in optimizer.param_groups for p in g["params"]]
    assert len(ids) == len(set(ids)) and set(ids) == {id(p) for p in model.parameters()}  # each in exactly one group
    by_id = {id(p): n for n, p in model.named_parameters()}
    assert {by_id[id(p)] for p in kept["params"]} == exempt


def test_configure_optimizer_rejects_bad_arguments():
    model = ByteLM(tiny())
    with pytest.raises(ValueError, match="lr"):
        configure_optimizer(model, 0.0)
    with pytest.raises(ValueError, match="betas"):
        configure_optimizer(model, 1e-3, 0.1, (0.9, 1.0))


@pytest.mark.parametrize("attention, params", VARIANTS)
def test_reset_parameters_restores_the_init(attention, params):
    cfg = tiny(attention, params)
    torch.manual_seed(3)
    fresh = ByteLM(cfg)
    model = ByteLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(-2).add_(1)
    torch.manual_seed(3)
    model.reset_parameters()
    for (name, a), b in zip(fresh.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name
    assert model.head.weight is model.tok_emb.weight


def test_init_keeps_hkts_own_and_scales_the_residual_branches():
    cfg = tiny("hkt", {"n_levels": 3}, n_layers=4)
    torch.manual_seed(0)
    layer = ByteLM(cfg).blocks[0].attn
    torch.manual_seed(0)
    reference = HierarchicalAttention(16, 2, 3, causal=True)
    assert torch.equal(layer.level_logits, torch.zeros(2, 3)) and torch.equal(layer.gate_logits, torch.zeros(2))
    ratio = layer.q_proj[0].weight.std() / layer.k_proj[0].weight.std()  # queries carry sqrt(L) (same law as keys)
    assert 1.3 < ratio < 2.3, ratio  # sqrt(3) = 1.73
    # the output projection: the layer's own draw times 1 / sqrt(2 N), the same law as a fresh layer's
    assert 0.5 < layer.out_proj.weight.std() * math.sqrt(8) / reference.out_proj.weight.std() < 2.0
    fc2 = ByteLM(cfg).blocks[0].mlp[-1].weight
    assert abs(fc2.std().item() - 0.02 / math.sqrt(8)) < 0.002


def test_first_loss_is_uniform():
    torch.manual_seed(0)
    model = ByteLM(tiny()).eval()
    x = torch.randint(0, 256, (8, 65))
    loss = nn.functional.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten()).item()
    assert abs(loss - math.log(256)) < 0.05


def test_input_checks():
    model = ByteLM(tiny())
    with pytest.raises(ValueError, match="max_len"):
        model(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="input_ids"):
        model(torch.full((1, 3), 256))
    with pytest.raises(TypeError, match="cfg"):
        ByteLM({"d_model": 16})
    with pytest.raises(ValueError, match="window"):
        tiny("mha_window", {"window": 0})
    with pytest.raises(ValueError, match="unknown key"):
        tiny("mha", {"n_levels": 2})


def test_config_round_trip():
    cfg = tiny("hkt", {"n_levels": 2})
    assert LMConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.attention_params == {"n_levels": 2, "stride": 2, "kernel_size": None, "conv_kernel_size": 3}
    train = LMTrainConfig(steps=10, warmup=2)
    assert LMTrainConfig.from_dict(train.to_dict()) == train
    with pytest.raises(ValueError, match="unknown key"):
        LMConfig.from_dict({"d_modl": 3})


def test_learning_rate_schedule():
    cfg = LMTrainConfig(steps=101, lr=1.0, min_lr=0.1, warmup=10)
    assert lr_at(0, cfg) == pytest.approx(0.1) and lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(10, cfg) == pytest.approx(1.0) and lr_at(100, cfg) == pytest.approx(0.1)
    assert lr_at(55, cfg) == pytest.approx(0.55)  # half-way down the cosine


PATTERN = b"abcdefgh" * 2000  # period 8: after one period the next byte is determined


@pytest.fixture(scope="module")
def trained():
    torch.set_num_threads(1)
    cfg = LMConfig(d_model=32, n_heads=2, n_layers=1, max_len=32, attention="hkt", attention_params={"n_levels": 2})
    train = LMTrainConfig(steps=100, batch_size=8, lr=1e-2, warmup=10, eval_every=50, eval_windows=8,
                          final_windows=16, sample_prompt="cdefgh", sample_tokens=12)
    return train_lm(cfg, train, PATTERN, PATTERN[5:], seed=0)


def test_training_learns_a_periodic_pattern(trained):
    model, record = trained
    assert record["val_bpb"] < 1.0, record["val_bpb"]  # from 8 bits per byte at the start
    assert record["history"][-1]["step"] == 100 and len(record["history"]) == 2
    assert len(record["sequence_bpb"]) == 16
    assert record["n_params"] == count_lm_parameters(model)


def test_greedy_generation_reproduces_the_pattern(trained):
    model, _ = trained
    prompt = torch.tensor([list(b"abcdefgh" * 2)])
    out = generate(model, prompt, 40, temperature=0)  # 56 > 32 = max_len: the window slides
    assert bytes(out[0].tolist()) == (b"abcdefgh" * 8)[:56]
    assert generate(model, prompt, 0).shape == prompt.shape
    with pytest.raises(ValueError, match="temperature"):
        generate(model, prompt, 3, temperature=-1)
    with pytest.raises(ValueError, match="top_k"):
        generate(model, prompt, 3, top_k=0)


def test_top_k_one_is_greedy(trained):
    model, _ = trained
    prompt = torch.tensor([list(b"abcdef")])
    assert torch.equal(generate(model, prompt, 10, top_k=1, generator=torch.Generator().manual_seed(1)),
                       generate(model, prompt, 10, temperature=0))


def test_generate_calls_the_decoder_hook(trained):
    model, _ = trained
    calls = []

    class Spy:
        def prefill(self, idx):
            calls.append(("prefill", idx.shape[1]))
            return model(idx[:, -32:])[:, -1]

        def step(self, idx, token):
            calls.append(("step", idx.shape[1]))
            assert torch.equal(idx[:, -1], token)
            return model(idx[:, -32:])[:, -1]

    prompt = torch.tensor([list(b"abcdefgh")])
    assert torch.equal(generate(model, prompt, 5, temperature=0, decoder=Spy()), generate(model, prompt, 5, temperature=0))
    assert calls == [("prefill", 8), ("step", 9), ("step", 10), ("step", 11), ("step", 12)]


def test_record_round_trip(trained, tmp_path):
    _, record = trained
    path = save_record(record, tmp_path / "lm-x.json")
    assert load_record(path) == record
    with pytest.raises(FileNotFoundError, match="no such record"):
        load_record(tmp_path / "missing.json")


def test_compare_lm_is_paired():
    a = {"model": "a", "sequence_bpb": [1.0, 2.0, 3.0, 4.0]}
    b = {"model": "b", "sequence_bpb": [1.5, 2.5, 3.4, 4.6]}
    c = compare_lm(a, b)
    assert c["difference"] == pytest.approx(0.5) and c["low"] > 0 and c["p_value"] < 0.05 and c["n"] == 4
    assert compare_lm(b, a)["difference"] == pytest.approx(-0.5)
    with pytest.raises(ValueError, match="different held-out windows"):
        compare_lm(a, {"sequence_bpb": [1.0]})


def test_eval_windows_are_consecutive():
    data = torch.arange(23, dtype=torch.uint8)
    w = eval_windows(data, 4)
    assert w.shape == (4, 5) and torch.equal(w.flatten(), torch.arange(20))
    with pytest.raises(ValueError, match="fewer than one window"):
        eval_windows(data[:3], 4)


def test_presets_are_parameter_matched():
    for preset in LM_PRESETS:
        counts = {m: count_lm_parameters(lm_model_config(m, preset)) for m in LM_MODELS}
        cfg = lm_model_config("mha", preset)
        tolerance = cfg.n_layers * (2 * cfg.d_model + 1) / 2
        assert max(counts.values()) - min(counts.values()) <= 2 * tolerance, (preset, counts)
        assert lm_model_config("mha_window", preset).attention_params["window"] == LM_PRESETS[preset].window


def test_runner_skips_finished_runs(tmp_path, one_thread):
    data = (PATTERN[:4000], PATTERN[:2000])
    records = run_lm(["mha"], "smoke", results_dir=tmp_path, data=data, log=None)
    path = tmp_path / "lm-mha-smoke-seed0.json"
    assert path.is_file() and load_record(path) == records["mha", 0]
    stamp = path.stat().st_mtime_ns
    again = run_lm(["mha"], "smoke", results_dir=tmp_path, data=data, log=None)
    assert again == records and path.stat().st_mtime_ns == stamp  # loaded, not retrained


def test_imdb_bytes_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="plain_text"):
        imdb_bytes("train", data_dir=tmp_path, cache_dir=tmp_path / "cache")
    with pytest.raises(ValueError, match="split"):
        imdb_bytes("validation", data_dir=tmp_path)


def test_imdb_bytes_reads_the_reviews(data_dir, tmp_path):
    text = imdb_bytes("test", data_dir=data_dir, cache_dir=tmp_path, max_bytes=100_000)
    assert len(text) == 100_000 and b"<br />" in text
    assert (tmp_path / "lm" / "imdb-test.bin").is_file()
    assert imdb_bytes("test", data_dir=data_dir, cache_dir=tmp_path, max_bytes=100_000) == text


def test_generation_timing_uses_the_decoder_and_checks_the_context(trained):
    from hkt_nb.lm import RecomputeDecoder, generation_ms_per_token
    model, _ = trained
    built = []

    def factory(m):
        built.append(m)
        return RecomputeDecoder(m)

    assert generation_ms_per_token(model, 16, new_tokens=4, decoder_factory=factory) > 0 and built == [model]
    with pytest.raises(ValueError, match="context"):
        generation_ms_per_token(model, 30, new_tokens=4)  # 30 + 4 > max_len = 32
    with pytest.raises(ValueError, match="statistic"):
        generation_ms_per_token(model, 16, new_tokens=4, statistic="mean")
    assert generation_ms_per_token(model, 16, new_tokens=4, decoder_factory=CachedDecoder, statistic="min") > 0


# --- cached decoding (issue 18, item 2) -----------------------------------------------------------------------------

CACHED = [("mha", {}), ("mha_window", {"window": 5}), ("hkt", {"n_levels": 1}), ("hkt", {"n_levels": 3}),
          ("hkt", {"n_levels": 3, "stride": 3, "kernel_size": 4}), ("hkt", {"n_levels": 2, "stride": 4, "kernel_size": 5})]
PROMPTS = [1, 5, 17]


def random_lm(randomise, attention, params, **kw) -> ByteLM:
    "A float64 model of `tiny` shape (max_len 64) with every parameter N(0, 0.3^2): non-trivial gates and logits."
    torch.manual_seed(0)
    return randomise(ByteLM(tiny(attention, params, **kw)).double()).eval()


def cached_logits(model: ByteLM, seq: torch.Tensor, prompt_length: int) -> torch.Tensor:
    "Logits (B, T - P + 1, V) at positions P - 1 .. T - 1 from `prefill` on the first P bytes, then one step a byte."
    decoder = CachedDecoder(model)
    out = [decoder.prefill(seq[:, :prompt_length])]
    out += [decoder.step(seq[:, : t + 1], seq[:, t]) for t in range(prompt_length, seq.shape[1])]
    return torch.stack(out, 1)


def assert_cached_equals_full(model, T=64, B=2):
    seq = torch.randint(0, 256, (B, T))
    full = model(seq)  # T = 64 crosses blocks of every level: s^l = 2, 4, 8 / 3, 9 / 4
    for P in PROMPTS:
        torch.testing.assert_close(cached_logits(model, seq, P), full[:, P - 1 :], rtol=0, atol=1e-10,
                                   msg=lambda m: f"prompt length {P}: {m}")


@pytest.mark.parametrize("attention, params", CACHED)
def test_cached_logits_equal_the_full_forward(randomise, attention, params, one_thread):
    assert_cached_equals_full(random_lm(randomise, attention, params))


@pytest.fixture(scope="module")
def trained_models():
    "float64 copies of briefly trained models (30 steps on a period-8 pattern), one per cached variant."
    torch.set_num_threads(1)
    train = LMTrainConfig(steps=30, batch_size=8, lr=1e-2, warmup=5, eval_every=30, eval_windows=4, final_windows=8,
                          sample_tokens=4)
    models = {}
    for attention, params in CACHED:
        model, record = train_lm(tiny(attention, params), train, PATTERN, PATTERN[3:], seed=0)
        models[attention, tuple(sorted(params.items()))] = (model.double().eval(), record)
    return models


@pytest.mark.parametrize("attention, params", CACHED)
def test_cached_logits_of_a_trained_model_equal_the_full_forward(trained_models, attention, params):
    model, record = trained_models[attention, tuple(sorted(params.items()))]
    assert record["val_bpb"] < 6.0  # it learned something: the uniform model has 8 bits per byte
    assert_cached_equals_full(model)
    seq = torch.tensor([list(PATTERN[:64])])  # and on the text it was trained on
    torch.testing.assert_close(cached_logits(model, seq, 5), model(seq)[:, 4:], rtol=0, atol=1e-10)


@pytest.mark.parametrize("attention, params", CACHED)
def test_cached_generation_equals_recomputed_generation_past_max_len(randomise, trained_models, attention, params):
    prompt = torch.randint(0, 256, (2, 5))
    trained = trained_models[attention, tuple(sorted(params.items()))][0]
    for model in (random_lm(randomise, attention, params), trained):
        assert isinstance(default_decoder(model), CachedDecoder)
        for P in (1, 5):  # P + 100 > max_len = 64: the window slides and the caches are rebuilt
            greedy = generate(model, prompt[:, :P], 100, temperature=0)
            assert greedy.shape == (2, P + 100)
            assert torch.equal(greedy, generate(model, prompt[:, :P], 100, temperature=0, decoder=RecomputeDecoder(model)))
    long_prompt = torch.randint(0, 256, (1, 90))  # a prompt longer than max_len: its last 64 bytes
    assert torch.equal(generate(trained, long_prompt, 10, temperature=0),
                       generate(trained, long_prompt, 10, temperature=0, decoder=RecomputeDecoder(trained)))
    sampled = [generate(trained, prompt, 80, temperature=1.0, top_k=20, generator=torch.Generator().manual_seed(3),
                        decoder=make(trained)) for make in (CachedDecoder, RecomputeDecoder)]
    assert torch.equal(*sampled)


def test_the_window_cache_attends_the_newest_keys(randomise):
    layer = randomise(SlidingWindowAttention(16, 4, causal=True, window=6).double())
    cache = layer_cache(layer, 2)
    assert type(cache) is WindowKVCache and cache.window == 6
    x = torch.randn(2, 40, 16, dtype=torch.float64)
    for P in (1, 5, 17):
        torch.testing.assert_close(cached_forward(layer, x, P), layer(x), rtol=0, atol=1e-12)
    assert type(layer_cache(MultiHeadAttention(16, 4, causal=True), 1)) is KVCache  # the parent keeps its own


def test_a_variant_without_a_cache_is_recomputed(attention_registry):
    @dataclass(frozen=True)
    class NoParams:
        pass

    class Custom(MultiHeadAttention):  # a subclass (it might attend differently): it must not inherit the KV cache
        pass

    register_attention("uncached", lambda d, h, causal, dropout, p: Custom(d, h, causal, dropout), NoParams)
    model = ByteLM(tiny("uncached")).eval()
    assert isinstance(default_decoder(model), RecomputeDecoder)
    with pytest.raises(TypeError, match="Custom"):
        CachedDecoder(model)
    prompt = torch.tensor([list(b"abc")])
    assert generate(model, prompt, 5, temperature=0).shape == (1, 8)


def test_cached_decoder_errors(randomise):
    model = random_lm(randomise, "hkt", {"n_levels": 2}, dropout=0.1)
    with pytest.raises(ValueError, match="prefill"):
        CachedDecoder(model).step(torch.tensor([[1, 2]]), torch.tensor([2]))
    model.train()
    with pytest.raises(ValueError, match="eval"):
        CachedDecoder(model).prefill(torch.tensor([[1, 2]]))
    model.eval()  # dropout is then the identity, and the cached logits equal the forward's
    assert_cached_equals_full(model, T=20, B=1)
    with pytest.raises(ValueError, match="input_ids"):
        CachedDecoder(model).prefill(torch.tensor([[1, 256]]))


def test_generate_refuses_a_model_that_is_not_a_byte_lm():
    "A user's own model gets a TypeError naming `model` and the layer-level loop, not an AttributeError on `cfg`."
    class GPT(nn.Module):  # a model of one's own, without ByteLM's cfg / blocks / head
        def forward(self, idx):
            return torch.zeros(*idx.shape, 256)

    with pytest.raises(TypeError, match=r"model must be a hkt_nb\.lm\.ByteLM.*got GPT.*layer_cache.*prefill.*step"):
        generate(GPT(), torch.tensor([[1, 2, 3]]), 4, temperature=0)
    assert generate(ByteLM(tiny()).eval(), torch.tensor([[1, 2, 3]]), 4, temperature=0).shape == (1, 7)


# --- byte n-gram baselines (chapter 15, *Baselines: byte n-gram counts*)

def reference_probability(text: bytes, order: int, alpha: float, context: bytes, x: int) -> float:
    "p_n(x | context) by the recursion with plain dict counts (the chapter's equation, one byte at a time)."
    p = 1 / 256
    for k in range(1, order + 1):
        if k - 1 > len(context):
            break
        c = context[len(context) - (k - 1):] if k > 1 else b""
        grams = Counter(text[i - k + 1: i + 1] for i in range(k - 1, len(text)))
        count_c = sum(v for g, v in grams.items() if g[:-1] == c)
        p = (grams.get(c + bytes([x]), 0) + alpha * p) / (count_c + alpha)
    return p


def test_unigram_with_vanishing_alpha_is_the_empirical_distribution():
    text = b"abracadabra"
    p = ngram_distribution(fit_byte_ngram(text, 1), b"xyz", alpha=1e-12)
    expected = np.zeros(256)
    for byte, count in Counter(text).items():
        expected[byte] = count / len(text)
    np.testing.assert_allclose(p, expected, atol=1e-10)


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_every_distribution_sums_to_one(order):
    model = fit_byte_ngram(b"the cat sat on the mat; the hat", order)
    for context in (b"", b"t", b"the", b" th", b"zzz", b"\x00\xff", b"the cat sat"):  # seen, unseen, short, long
        for alpha in (0.01, 1.0, 30.0):
            p = ngram_distribution(model, context, alpha)
            assert p.shape == (256,) and (p > 0).all()
            assert abs(p.sum() - 1) < 1e-12, (order, context, alpha)


def test_a_repeated_byte_costs_almost_nothing_at_order_two():
    text = b"a" * 10_000
    model = fit_byte_ngram(text, 2)
    bpb = ngram_bits_per_byte(model, eval_windows(torch.frombuffer(bytearray(text), dtype=torch.uint8), 64), alpha=1e-3)
    assert bpb.shape == (153,) and bpb.max() < 1e-3
    # the unigram is as sure: only 'a' was ever seen, so the bits come from the prior's weight alone
    assert np.allclose(ngram_bits_per_byte(model.truncated(1), np.full((2, 5), 97), 1e-3), -math.log2((1e4 + 1e-3 / 256) / (1e4 + 1e-3)))


@pytest.mark.parametrize("order", [1, 2, 3])
def test_window_bits_equal_a_slow_reference(order):
    rng = np.random.default_rng(order)
    text = bytes(rng.choice(np.frombuffer(b"abcd e", np.uint8), 400, p=[0.3, 0.2, 0.2, 0.1, 0.1, 0.1]).tolist())
    held_out = bytes(rng.choice(np.frombuffer(b"abcdef", np.uint8), 3 * 9).tolist())  # 'f' is never seen
    windows = eval_windows(torch.frombuffer(bytearray(held_out), dtype=torch.uint8), 8)  # (3, 9)
    model, alpha = fit_byte_ngram(text, order), 0.7
    expected = [np.mean([-math.log2(reference_probability(text, order, alpha, bytes(w[max(0, t - order + 1):t]), w[t]))
                         for t in range(1, 9)]) for w in windows.tolist()]
    np.testing.assert_allclose(ngram_bits_per_byte(model, windows, alpha), expected, rtol=1e-12)


def test_no_context_crosses_a_window_start():
    model = fit_byte_ngram(b"xy" * 50 + b"q", 3)
    w = np.frombuffer(b"xyxyqx", np.uint8)[None].astype(np.int64)
    joint, context = ngram_window_counts(model, w)  # (3, 1, 5): levels 1..3, bytes 1..5 of the window
    assert (joint[2, 0, 0] == 0) and (context[2, 0, 0] == 0)  # byte 1 has one byte before it: no trigram
    assert joint[1, 0, 0] == 50 and context[2, 0, 1] == 50 and joint[2, 0, 1] == 49  # 'xy' is followed by 'x' 49 times
    # the same bytes scored in one window or after another window: the first bytes of a window back off
    split = ngram_bits_per_byte(model, np.array([list(b"xyx"), list(b"yqx")]), 1.0)
    by_hand = [np.mean([-math.log2(ngram_distribution(model, c, 1.0)[ord(x)]) for c, x in cases])
               for cases in ([(b"x", "y"), (b"xy", "x")], [(b"y", "q"), (b"yq", "x")])]
    np.testing.assert_allclose(split, by_hand, rtol=1e-12)


def test_ngram_input_errors():
    with pytest.raises(ValueError, match="order"):
        fit_byte_ngram(b"abc", 0)
    with pytest.raises(ValueError, match="order"):
        fit_byte_ngram(b"abc", 8)
    with pytest.raises(ValueError, match="data has 0 bytes"):
        fit_byte_ngram(b"", 1)
    with pytest.raises(ValueError, match="data has 2 bytes, fewer than order=3"):
        fit_byte_ngram(b"ab", 3)
    with pytest.raises(TypeError, match="data"):
        fit_byte_ngram("text", 2)
    with pytest.raises(ValueError, match="alpha"):
        interpolated_ngram_probability(np.zeros((1, 3)), np.zeros((1, 3)), 0.0)
    with pytest.raises(ValueError, match="windows"):
        ngram_bits_per_byte(fit_byte_ngram(b"abc", 1), np.zeros((3, 1), np.int64), 1.0)
    with pytest.raises(ValueError, match="held_out has 5 bytes"):
        fit_ngram_baselines(b"a" * 100, b"b" * 5, block=8)
    with pytest.raises(ValueError, match="train_data has 12 bytes"):
        fit_ngram_baselines(b"a" * 12, b"b" * 50, block=8)
    with pytest.raises(ValueError, match="preset"):
        ngram_baselines("tiny")


def test_baselines_choose_alpha_on_the_end_of_the_training_text_and_reuse_the_record(tmp_path):
    rng = np.random.default_rng(0)
    train = bytes(rng.integers(97, 101, 300_000).tolist())  # smoke keeps 200,000 of them
    held_out = bytes(rng.integers(97, 101, 50_000).tolist())
    record = ngram_baselines("smoke", tmp_path, data=(train, held_out), orders=(1, 2), alphas=(0.1, 10.0), log=None)
    entry = record["baselines"]["ngram2"]
    assert record["data"]["train_bytes"] == 200_000 and record["data"]["validation_bytes"] == 10_000
    assert len(entry["sequence_bpb"]) == 32 and entry["alpha"] in (0.1, 10.0)
    assert entry["validation_bpb"] == min(entry["validation_bpb_by_alpha"].values())
    assert abs(entry["val_bpb"] - 2.0) < 0.02  # four equiprobable letters: 2 bits each
    assert record["strongest"] in ("ngram1", "ngram2")
    # the order is chosen on the validation slice, never on the held-out windows
    assert record["strongest"] == min(record["baselines"], key=lambda k: record["baselines"][k]["validation_bpb"])
    again = ngram_baselines("smoke", tmp_path, data=(train, held_out), orders=(1, 2), alphas=(0.1, 10.0), log=None)
    assert again == record  # loaded, not refit (the fit times would differ)
    other = ngram_baselines("smoke", tmp_path, data=(held_out * 5, held_out), orders=(1, 2), alphas=(0.1, 10.0), log=None)
    assert other["data"]["train_sha256"] != record["data"]["train_sha256"]


def test_learned_the_task_needs_every_seed_above_the_baseline():
    base = {"model": "ngram2", "val_bpb": 2.0, "sequence_bpb": [2.0, 2.1, 1.9, 2.0, 2.05]}
    good = {"model": "good", "sequence_bpb": [1.5, 1.6, 1.4, 1.5, 1.55]}
    level = {"model": "level", "sequence_bpb": [2.0, 2.1, 1.9, 2.0, 2.05]}  # equal to the baseline: not better
    assert lm_learned_the_task({0: good, 1: good}, base)["learned"] is True
    status = lm_learned_the_task({0: good, 1: level}, base)
    assert status["learned"] is False and status["below"] == [1] and status["bar"] == 2.0
    assert counted_lm_verdict("x", status, status, ("level", "good")).startswith("excluded (level and good have")
    assert counted_lm_verdict("x", lm_learned_the_task({0: good}, base), lm_learned_the_task({0: good}, base), ("a", "b")) == "x"
    with pytest.raises(ValueError, match="different held-out windows"):
        lm_learned_the_task({0: {"sequence_bpb": [1.0]}}, base)


def test_alpha_is_chosen_on_the_end_of_the_training_text_only():
    rng = np.random.default_rng(1)
    train = bytes(rng.integers(97, 105, 4_000).tolist())
    held_out = bytes(rng.integers(97, 105, 900).tolist())
    out = fit_ngram_baselines(train, held_out, block=16, orders=(2,), alphas=(0.3, 3.0), val_fraction=0.1)["ngram2"]
    head, tail = train[:3_600], torch.frombuffer(bytearray(train[3_600:]), dtype=torch.uint8)  # the last 10 %
    for alpha in (0.3, 3.0):
        expected = ngram_bits_per_byte(fit_byte_ngram(head, 2), eval_windows(tail, 16), alpha).mean()
        assert out["validation_bpb_by_alpha"][repr(alpha)] == pytest.approx(expected, rel=1e-12)
    held = ngram_bits_per_byte(fit_byte_ngram(train, 2), eval_windows(torch.frombuffer(bytearray(held_out), dtype=torch.uint8), 16), out["alpha"])
    np.testing.assert_allclose(out["sequence_bpb"], held, rtol=1e-12)  # refit on the whole training text
    other = fit_ngram_baselines(train, held_out[::-1], block=16, orders=(2,), alphas=(0.3, 3.0), val_fraction=0.1)["ngram2"]
    assert other["validation_bpb_by_alpha"] == out["validation_bpb_by_alpha"]  # the held-out text chooses nothing


def test_lm_grid_script_skips_a_run_another_queue_holds(tmp_path):
    "Two queues share the LM grid: a run whose lock another process holds is skipped, not trained twice."
    import subprocess
    import sys
    from pathlib import Path

    from hkt_nb.train.checkpoints import run_lock

    root = Path(__file__).resolve().parents[1]
    env = {**__import__("os").environ, "HKT_RESULTS_DIR": str(tmp_path)}
    name = "lm-mha-smoke-seed0"
    with run_lock(tmp_path / "lm" / f"{name}.lock", name):
        out = subprocess.run([sys.executable, str(root / "scripts" / "run_lm_grid.py"), "--preset", "smoke",
                              "--models", "mha", "--seeds", "0"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"skipped {name}" in out.stdout and f"training {name}" not in out.stdout
    assert not (tmp_path / "lm" / f"{name}.json").exists()


class _UsersGPT(nn.Module):
    "A GPT-style model written without the library's helpers (a user's own), with HKT's causal attention."
    def __init__(self, d_model=16, n_heads=2):
        super().__init__()
        self.emb = nn.Embedding(256, d_model)
        self.ln = nn.LayerNorm(d_model)
        self.attn = HierarchicalAttention(d_model, n_heads, 3, causal=True)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))
        self.head = nn.Linear(d_model, 256, bias=False)


def test_no_weight_decay_of_a_users_own_model():
    "`hkt_nb.no_weight_decay` on any model: biases, norms, level and gate logits; not the weights or conv kernels."
    from hkt_nb import no_weight_decay

    model = _UsersGPT()
    exempt = no_weight_decay(model)
    assert {"ln.weight", "ln.bias", "attn.level_logits", "attn.gate_logits", "attn.value_conv.bias",
            "attn.pyramid.down.0.depthwise.bias", "attn.pyramid.down.1.pointwise.bias", "mlp.0.bias"} <= exempt
    assert not exempt & {"emb.weight", "head.weight", "attn.value_conv.weight", "attn.q_proj.0.weight",
                         "attn.pyramid.down.0.depthwise.weight", "mlp.0.weight"}
    assert exempt == {n for n, _ in model.named_parameters()
                      if n.endswith(("bias", "logits")) or n.startswith("ln.")}
    groups = configure_optimizer(model, 1e-3, 0.1).param_groups  # no no_weight_decay() method: the same rule
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[id(p)] for p in groups[1]["params"]} == exempt and groups[1]["weight_decay"] == 0.0
    with pytest.raises(TypeError, match="nn.Module"):
        no_weight_decay({"w": torch.zeros(2)})


def _install_page_section_code(heading: str) -> str:
    """The python code blocks of one `## ` section of the page *Installing, building and contributing*
    (nbs/98_install.ipynb; the README's drop-in section moved there), joined."""
    import re
    from pathlib import Path

    import nbformat
    page = nbformat.read(Path(__file__).resolve().parents[1] / "nbs" / "98_install.ipynb", as_version=4)
    text = "\n\n".join(cell.source for cell in page.cells if cell.cell_type == "markdown")
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return "\n".join(re.findall(r"```python\n(.*?)```", section, flags=re.S))


def test_install_page_drop_in_block_and_cached_generation():
    "The install page's GPT-style block and its cached greedy decoding run as written and equal full-forward decoding."
    namespace = {}
    exec(_install_page_section_code("Drop-in use in a GPT-style model"), namespace)
    Block, cached_generate = namespace["Block"], namespace["cached_generate"]
    torch.manual_seed(0)
    blocks = nn.ModuleList(Block(d_model=16, n_heads=2, n_levels=3) for _ in range(2)).double().eval()
    tok, pos = nn.Embedding(256, 16).double(), nn.Embedding(64, 16).double()
    ln_f, head = nn.LayerNorm(16).double(), nn.Linear(16, 256, bias=False).double()

    def embed(ids, start):
        return tok(ids) + pos(torch.arange(start, start + ids.shape[1]))

    def full_logits(ids):
        h = embed(ids, 0)
        for b in blocks:
            h = b(h)
        return head(ln_f(h))

    for prompt_length in (1, 5):
        prompt = torch.randint(0, 256, (2, prompt_length))
        with torch.no_grad():
            expected = prompt
            for _ in range(20):  # across blocks of every level (s^2 = 4)
                expected = torch.cat([expected, full_logits(expected)[:, -1:].argmax(-1)], 1)
        assert torch.equal(cached_generate(blocks, embed, ln_f, head, prompt, 20), expected)


def test_load_lm_runs_reads_finished_conforming_records_only(tmp_path):
    "The chapter's `cpu` section reads the runs `run_lm` would reuse: finished, today's settings; a damaged file is named."
    import json

    from hkt_nb.lm import LM_PRESETS, lm_model_config, lm_run_name, load_lm_runs

    train = LM_PRESETS["smoke"].train.to_dict()

    def write(model, seed, **changes):
        record = {"finished": True, "config": lm_model_config(model, "smoke").to_dict(), "train": train, **changes}
        (tmp_path / f"{lm_run_name(model, 'smoke', seed)}.json").write_text(json.dumps(record))

    write("mha", 0)
    write("hkt_l3", 0, finished=False)  # still training (or interrupted)
    write("hkt_l1", 0, train={**train, "steps": 41})  # a preset that has changed since
    assert list(load_lm_runs("smoke", tmp_path)) == [("mha", 0)]
    assert load_lm_runs("smoke", tmp_path, ["hkt_l3"]) == {}
    (tmp_path / "lm-hkt_l2-smoke-seed0.json").write_text("{ cut short")
    with pytest.raises(ValueError, match="lm-hkt_l2-smoke-seed0.json: unreadable run record"):
        load_lm_runs("smoke", tmp_path)
    with pytest.raises(ValueError, match="preset"):
        load_lm_runs("huge", tmp_path)


def test_the_baselines_fit_every_order_the_codes_allow_and_the_rules_are_the_chapters():
    "The n-gram bar is the best of orders 1..MAX_NGRAM_ORDER (a reviewer found order 4 far below orders 5-7)."
    from hkt_nb.lm import LM_VERDICT_RULES, MAX_NGRAM_ORDER, NGRAM_ORDERS

    assert NGRAM_ORDERS == tuple(range(1, MAX_NGRAM_ORDER + 1)) and 256 ** MAX_NGRAM_ORDER < 2 ** 63
    assert [line[:2] for line in LM_VERDICT_RULES.splitlines()[:5]] == ["1.", "2.", "3.", "4.", "5."]
    assert "chosen on the validation slice" in LM_VERDICT_RULES and "McNemar" not in LM_VERDICT_RULES


def test_committed_cpu_baselines_are_the_presets_and_chosen_on_validation():
    "results/lm/baselines-cpu.json has today's settings (all orders) and its strongest order is the validation choice."
    import json
    from pathlib import Path

    from hkt_nb.lm import NGRAM_ORDERS, NGRAM_RECORD_VERSION

    path = Path(__file__).resolve().parents[1] / "results" / "lm" / "baselines-cpu.json"
    if not path.is_file():
        pytest.skip("no committed cpu baselines")
    record = json.loads(path.read_text())
    assert record["settings"]["version"] == NGRAM_RECORD_VERSION and record["settings"]["orders"] == list(NGRAM_ORDERS)
    assert record["strongest"] == min(record["baselines"], key=lambda k: record["baselines"][k]["validation_bpb"])


def test_lm_established_sentence_follows_the_records(tmp_path):
    "The first page's language-model sentence: no runs, no baselines, no model past counting, a decided comparison."
    import json

    from hkt_nb.lm import LM_PRESETS, lm_established_sentence, lm_model_config, lm_run_name, ngram_settings

    assert "no runs are on disk" in lm_established_sentence("smoke", tmp_path)
    train = LM_PRESETS["smoke"].train.to_dict()
    for model, bpb in (("hkt_l3", 2.0), ("mha", 2.1)):
        record = {"finished": True, "model": model, "config": lm_model_config(model, "smoke").to_dict(), "train": train,
                  "sequence_bpb": [bpb] * 4 + [bpb + 0.1, bpb + 0.2]}
        (tmp_path / f"{lm_run_name(model, 'smoke', 0)}.json").write_text(json.dumps(record))
    assert "baselines are not on disk" in lm_established_sentence("smoke", tmp_path)

    def baseline(bpb, settings=ngram_settings("smoke")):
        entry = {"model": "ngram7", "val_bpb": bpb, "sequence_bpb": [bpb] * 6}
        (tmp_path / "baselines-smoke.json").write_text(json.dumps({"baselines": {"ngram7": entry}, "strongest": "ngram7",
                                                                   "settings": settings}))

    baseline(1.5, {**ngram_settings("smoke"), "orders": [1, 2, 3, 4], "version": 1})  # a record of an older version
    assert "not on disk with this version's settings" in lm_established_sentence("smoke", tmp_path)
    baseline(1.5)
    assert "no model beats the strongest byte n-gram count model" in lm_established_sentence("smoke", tmp_path)
    baseline(3.0)  # both models beat counting, but one seed decides nothing (the rules need 3)
    assert lm_established_sentence("smoke", tmp_path).endswith(
        "`smoke` preset): no comparison is decided (its grid is still being trained).")
