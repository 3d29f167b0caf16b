"""Tests of hkt_nb.model: the attention-variant registry, the config's two forms, the classifier, parameter matching and
the committed checkpoints."""
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch
from torch import nn

from hkt_nb.model import (
    ClassifierConfig,
    HKTClassifier,
    count_parameters,
    get_attention_variant,
    masked_mean,
    match_parameters,
    matched_mha_config,
    register_attention,
)


@pytest.mark.parametrize("d_model,n_layers", [(64, 2), (128, 4)])
def test_matched_mha_has_same_parameter_count(d_model, n_layers):
    cfg = ClassifierConfig(vocab_size=30, n_classes=10, max_len=512, d_model=d_model, n_heads=4, n_layers=n_layers)
    mha = matched_mha_config(cfg)
    assert mha.attention == "mha" and mha.d_model == cfg.d_model and mha.n_layers == cfg.n_layers
    diff = abs(count_parameters(mha) - count_parameters(cfg))
    assert diff <= n_layers * (2 * d_model + 1) / 2
    assert count_parameters(HKTClassifier(mha)) == count_parameters(mha)


def test_padding_does_not_change_prediction():
    model = HKTClassifier(ClassifierConfig(vocab_size=11, n_classes=3, max_len=40, d_model=16, n_heads=2)).eval().double()
    ids = torch.randint(0, 11, (1, 23))
    padded = torch.cat([ids, torch.randint(0, 11, (1, 17))], 1)
    kpm = torch.arange(40)[None] >= 23
    torch.testing.assert_close(model(padded, kpm), model(ids), rtol=0, atol=1e-10)


def test_masked_mean_known_values_and_fully_padded_row():
    x = torch.arange(12.0).view(2, 3, 2)
    kpm = torch.tensor([[False, False, True], [True, True, True]])
    torch.testing.assert_close(masked_mean(x, kpm), torch.tensor([[1.0, 2.0], [0.0, 0.0]]))


def test_classifier_bad_inputs():
    model = HKTClassifier(ClassifierConfig(vocab_size=11, n_classes=3, max_len=16, d_model=16, n_heads=2))
    for bad, error in [(torch.zeros(1, 17, dtype=torch.long), ValueError), (torch.full((1, 4), 11), ValueError),
                       (torch.full((1, 4), -1), ValueError), (torch.zeros(1, 0, dtype=torch.long), ValueError),
                       (torch.zeros(4, dtype=torch.long), ValueError), (torch.zeros(1, 4), TypeError)]:
        with pytest.raises(error, match="^input_ids"):
            model(bad)
    with pytest.raises(TypeError, match="^cfg"):
        HKTClassifier({"vocab_size": 20, "n_classes": 3})


CONFIG = {"vocab_size": 20, "n_classes": 3}
BAD_CONFIG = [("vocab_size", 0, ValueError), ("vocab_size", 20.5, TypeError), ("n_classes", 0, ValueError),
              ("max_len", 0, ValueError), ("d_model", 0, ValueError), ("n_heads", 3, ValueError),
              ("n_layers", 0, ValueError), ("d_ff", 0, ValueError), ("dropout", 1.0, ValueError),
              ("attn_dropout", -0.1, ValueError), ("causal", "yes", TypeError), ("attention", "rnn", ValueError),
              ("attention_params", [("n_levels", 2)], TypeError)]
BAD_HKT_PARAMS = [("n_levels", 0, ValueError), ("stride", 1, ValueError), ("kernel_size", 1, ValueError),
                  ("conv_kernel_size", 0, ValueError), ("n_levels", 2.0, TypeError)]


@pytest.mark.parametrize("name,value,error", BAD_CONFIG, ids=[f"{n}={v!r}" for n, v, _ in BAD_CONFIG])
def test_config_rejects_bad_field(name, value, error):
    with pytest.raises(error, match=f"^{name}"):
        ClassifierConfig(**{**CONFIG, name: value})


@pytest.mark.parametrize("name,value,error", BAD_HKT_PARAMS, ids=[f"{n}={v!r}" for n, v, _ in BAD_HKT_PARAMS])
def test_config_rejects_bad_hkt_parameter(name, value, error):
    with pytest.raises(error, match=f"^{name}"):
        ClassifierConfig(**CONFIG, attention_params={name: value})


def test_match_parameters_refuses_an_unreachable_target():
    cfg = ClassifierConfig(**CONFIG, d_model=16, n_heads=2)
    with pytest.raises(ValueError, match="^target"):
        match_parameters(cfg, 10)


def test_fully_padded_sequence_gives_finite_logits_and_grads():
    model = HKTClassifier(ClassifierConfig(vocab_size=11, n_classes=3, max_len=16, d_model=16, n_heads=2))
    ids = torch.randint(0, 11, (2, 16))
    kpm = torch.zeros(2, 16, dtype=torch.bool)
    kpm[0] = True
    loss = model(ids, kpm).logsumexp(-1).sum()
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


# --- the attention-variant registry and the config's two forms (issue 22)

def test_every_committed_record_config_builds_with_its_parameter_count(committed_records):
    assert len(committed_records) >= 20
    for path, record in committed_records:
        legacy = record["config"]["model"]
        cfg = ClassifierConfig.from_dict(legacy)
        assert count_parameters(cfg) == record["n_params"], path.name
        assert ClassifierConfig.from_dict(cfg.to_dict()).to_dict() == cfg.to_dict(), path.name
        params = legacy.get("attention_params", {k: legacy[k] for k in cfg.attention_params if k in legacy})
        assert ClassifierConfig(**legacy) == cfg, path.name  # the flat keywords (older records) or the nested form
        if legacy["attention"] == "hkt":
            assert cfg.attention_params["n_levels"] == params["n_levels"]
        else:
            assert cfg.attention_params == {} == params


CHECKPOINTS = sorted((Path(__file__).resolve().parents[1] / "results" / "checkpoints").glob("*.pt"))


@pytest.mark.parametrize("path", CHECKPOINTS, ids=[p.name for p in CHECKPOINTS])
def test_committed_checkpoint_loads_in_eval_mode_with_finite_outputs(path):
    blob = torch.load(path, map_location="cpu", weights_only=True)
    model = HKTClassifier.from_checkpoint(path)
    assert not model.training and model.cfg == ClassifierConfig.from_dict(blob["config"])
    assert set(model.state_dict()) == set(blob["state_dict"])
    for key, value in blob["state_dict"].items():
        assert torch.equal(model.state_dict()[key], value), key
    ids = torch.randint(0, model.cfg.vocab_size, (2, min(64, model.cfg.max_len)))
    with torch.no_grad():
        logits = model(ids)
        assert logits.shape == (2, model.cfg.n_classes) and torch.isfinite(logits).all()
        torch.testing.assert_close(model(ids, impl="explicit"), logits, rtol=1e-4, atol=1e-5)


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no-such.pt"):
        HKTClassifier.from_checkpoint(tmp_path / "no-such.pt")


def test_unknown_attention_param_and_variant_are_refused():
    with pytest.raises(ValueError, match="^attention_params.*kernel"):
        ClassifierConfig(vocab_size=5, n_classes=2, attention_params={"kernel": 3})
    with pytest.raises(ValueError, match="^attention_params.*n_levels"):  # "mha" has no parameters of its own
        ClassifierConfig(vocab_size=5, n_classes=2, attention="mha", attention_params={"n_levels": 3})
    with pytest.raises(KeyError, match="hkt"):
        get_attention_variant("rnn")
    with pytest.raises(ValueError, match="^d .*bogus"):
        ClassifierConfig.from_dict({"vocab_size": 5, "n_classes": 2, "bogus": 1})


def test_to_dict_is_json_ready_and_from_dict_inverts_it():
    cfg = ClassifierConfig(vocab_size=5, n_classes=2, attention_params={"n_levels": 2, "kernel_size": 4})
    d = json.loads(json.dumps(cfg.to_dict()))
    assert d["attention_params"] == {"n_levels": 2, "stride": 2, "kernel_size": 4, "conv_kernel_size": 3}
    assert ClassifierConfig.from_dict(d) == cfg
    assert replace(cfg, n_levels=1).attention_params["n_levels"] == 1  # the flat keyword wins, as lra uses it


@dataclass(frozen=True)
class _MeanParams:
    scale: float = 1.0


class _MeanValueAttention(nn.Module):
    "A toy attention: every position gets the mean of the (real) values, projected."

    def __init__(self, d_model, n_heads, causal, attn_dropout, params):
        super().__init__()
        self.value, self.out, self.scale = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model), params.scale

    def forward(self, x, key_padding_mask=None, impl="fused"):
        mean = masked_mean(self.value(x), key_padding_mask)[:, None]
        return self.out(self.scale * mean.expand_as(x))


def test_a_variant_registered_in_the_test_trains(attention_registry):
    register_attention("mean", _MeanValueAttention, _MeanParams)
    cfg = ClassifierConfig(vocab_size=8, n_classes=2, max_len=16, d_model=16, n_heads=2, n_layers=1, dropout=0.0,
                           attention="mean", attention_params={"scale": 0.5})
    model = HKTClassifier(cfg)
    assert isinstance(model.blocks[0].attn, _MeanValueAttention) and model.blocks[0].attn.scale == 0.5
    ids = torch.randint(0, 8, (64, 16))
    labels = (ids == 3).sum(1).gt(2).long()  # a counting task: the mean of the values can carry it
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = nn.functional.cross_entropy(model(ids), labels)
        opt.zero_grad(), loss.backward(), opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]
    assert count_parameters(matched_mha_config(cfg)) - count_parameters(cfg) <= cfg.n_layers * (2 * 16 + 1) / 2


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("attention", ["hkt", "mha"])
def test_classifier_compiles_in_one_graph(attention, masked, graph_breaks):
    model = HKTClassifier(ClassifierConfig(vocab_size=10, n_classes=3, max_len=16, d_model=16, n_heads=2,
                                           n_layers=2, attention=attention))
    mask = torch.arange(12)[None] >= torch.tensor([[12], [9]])
    assert graph_breaks(model, torch.randint(0, 10, (2, 12)), mask if masked else None) == (0, [])


def test_no_string_comparison_against_a_variant_name_outside_the_registry(repo_root):
    "Variants are looked up in `ATTENTION_VARIANTS`, never compared by name (`== \"hkt\"`, `in (\"hkt\", \"mha\")`)."
    names = "|".join(sorted(get_attention_variant(n).name for n in ("hkt", "mha")))
    pattern = re.compile(rf"""(==|!=)\s*["']({names})(_l\d+)?["']|["']({names})["']\s*(==|!=)"""
                         rf"""|\bin\s*[(\[{{]\s*["']({names})["']|startswith\(\s*["']({names})""")
    found = [f"{path.relative_to(repo_root)}:{number}: {line.strip()}"
             for path in sorted((repo_root / "hkt_nb").rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert found == []


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.float32, torch.bool])
def test_ids_of_another_dtype_are_refused_naming_the_accepted_ones(dtype):
    model = HKTClassifier(ClassifierConfig(vocab_size=7, n_classes=2, max_len=8, d_model=8, n_heads=2, n_layers=1))
    with pytest.raises(TypeError, match=r"^input_ids must have dtype torch.int64 or torch.int32 .*got torch\." + str(dtype)[6:]):
        model(torch.zeros(2, 5, dtype=dtype))
    assert model(torch.zeros(2, 5, dtype=torch.int32)).shape == (2, 2)  # int32 is accepted


@pytest.mark.parametrize("attention", ["hkt", "mha"])
@pytest.mark.parametrize("causal", [False, True])
def test_fully_padded_row_gives_the_head_bias_and_leaves_the_others_alone(attention, causal):
    "The documented fallback: a fully padded sequence pools to zeros, so its logits are the head's bias; finite."
    cfg = ClassifierConfig(vocab_size=7, n_classes=3, max_len=16, d_model=8, n_heads=2, n_layers=2, causal=causal,
                           attention=attention)
    model = HKTClassifier(cfg).double().eval()
    ids = torch.randint(0, 7, (3, 11))
    mask = torch.arange(11)[None] >= torch.tensor([[11], [0], [4]])  # row 1: nothing real
    for impl in ("fused", "explicit"):
        logits = model(ids, mask, impl=impl)
        assert logits.isfinite().all()
        torch.testing.assert_close(logits[1], model.head.bias, rtol=0, atol=0)
        torch.testing.assert_close(logits[[0, 2]], model(ids[[0, 2]], mask[[0, 2]], impl=impl), rtol=0, atol=1e-12)


def test_masked_mean_never_reads_padding():
    x = torch.tensor([[[1.0], [3.0], [float("nan")]]])
    assert masked_mean(x, torch.tensor([[False, False, True]])).item() == 2.0


@pytest.fixture
def saved_model(tmp_path):
    model = HKTClassifier(ClassifierConfig(vocab_size=7, n_classes=2, max_len=16, d_model=8, n_heads=2, n_layers=1))
    path = tmp_path / "good.pt"
    torch.save({"config": model.cfg.to_dict(), "state_dict": model.state_dict()}, path)
    return model, path


def write_bad_file(kind, model, path, folder):
    "A file of `kind` in `folder` that is not a model checkpoint; returns its path."
    target = folder / f"{kind}.pt"
    if kind == "truncated":
        data = path.read_bytes()
        target.write_bytes(data[: len(data) // 2])
    elif kind == "json":
        target.write_text(json.dumps({"task": "listops", "accuracy": 0.3}))
    elif kind == "text":
        target.write_text("not a checkpoint\n")
    elif kind == "empty":
        target.write_bytes(b"")
    elif kind == "binary":
        target.write_bytes(bytes(range(256)))
    elif kind == "training":
        target = folder / "listops-hkt-cpu-s0" / "last.pt"
        target.parent.mkdir()
        torch.save({"fingerprint": {"task": "listops"}, "epoch": 2, "model": model.state_dict(), "optimizer": {},
                    "scheduler": {}, "history": []}, target)
    elif kind == "state_dict":
        torch.save(model.state_dict(), target)
    elif kind == "unknown_field":
        torch.save({"config": {**model.cfg.to_dict(), "n_experts": 4}, "state_dict": model.state_dict()}, target)
    elif kind == "wrong_weights":
        state = {k: v for k, v in model.state_dict().items() if not k.startswith("head")}
        torch.save({"config": model.cfg.to_dict(), "state_dict": state}, target)
    elif kind == "list":
        torch.save([1, 2, 3], target)
    return target


BAD_CHECKPOINTS = [
    ("truncated", "damaged: a truncated or partly written torch file"),
    ("json", "a text file \\(JSON\\?\\), not a model checkpoint.*model_path"),
    ("text", "a text file"),
    ("empty", "an empty file, not a model checkpoint"),
    ("binary", "not a torch file"),
    ("training", "a training checkpoint.*resume it with hkt-train.*results/checkpoints/listops-hkt-cpu-s0.pt"
                 ".*results/pretrained/listops-hkt-cpu-s0/"),
    ("state_dict", "a bare state_dict.*build the model from its config first"),
    ("unknown_field", "config does not fit this version's ClassifierConfig.*n_experts"),
    ("wrong_weights", "state_dict does not fit the model.*head"),
    ("list", "holds a list, not a model checkpoint"),
]


@pytest.mark.parametrize("kind,message", BAD_CHECKPOINTS, ids=[k for k, _ in BAD_CHECKPOINTS])
def test_from_checkpoint_names_a_bad_file_and_says_what_it_is(kind, message, saved_model, tmp_path):
    model, good = saved_model
    bad = write_bad_file(kind, model, good, tmp_path)
    with pytest.raises(ValueError, match=f"(?s)^{re.escape(str(bad))}:? .*{message}") as info:
        HKTClassifier.from_checkpoint(bad)
    assert "weights_only=False" not in str(info.value)
    error = info.value  # no chained torch traceback (which would advise weights_only=False)
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)
    loaded = HKTClassifier.from_checkpoint(str(good))  # the good file beside it still loads (a str path too)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in loaded.state_dict().items())
