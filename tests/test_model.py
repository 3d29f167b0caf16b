"""Tests of hkt_nb.model and hkt_nb.cost."""
import json
from dataclasses import dataclass, replace

import pytest
import torch
from torch import nn

from hkt_nb.cost import score_cost_ratio
from hkt_nb.model import (
    ClassifierConfig,
    HKTClassifier,
    count_parameters,
    get_attention_variant,
    masked_mean,
    matched_mha_config,
    register_attention,
)


def test_score_cost_ratio_known_values():
    assert score_cost_ratio(3, 2) == 1.3125
    assert score_cost_ratio(1) == 1.0
    assert abs(score_cost_ratio(40) - 4 / 3) < 1e-12
    assert abs(score_cost_ratio(3, 3) - (1 + 1 / 9 + 1 / 81)) < 1e-15


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
    with pytest.raises(ValueError, match="max_len"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="token ids"):
        model(torch.full((1, 4), 11))
    with pytest.raises(TypeError):
        model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match="attention"):
        ClassifierConfig(vocab_size=11, n_classes=3, attention="linear")


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
        assert ClassifierConfig(**legacy) == cfg, path.name  # the flat keywords, while lra passes them
        if legacy["attention"] == "hkt":
            assert cfg.attention_params["n_levels"] == legacy["n_levels"]
        else:
            assert cfg.attention_params == {}


def test_committed_checkpoint_loads_in_eval_mode_with_finite_outputs(repo_root):
    path = repo_root / "results" / "checkpoints" / "listops-hkt_l1-cpu-seed0.pt"
    blob = torch.load(path, map_location="cpu", weights_only=True)
    model = HKTClassifier.from_checkpoint(path)
    assert not model.training and model.cfg.attention_params["n_levels"] == blob["config"]["n_levels"] == 1
    assert set(model.state_dict()) == set(blob["state_dict"])
    for key, value in blob["state_dict"].items():
        assert torch.equal(model.state_dict()[key], value), key
    ids = torch.randint(0, model.cfg.vocab_size, (2, 37))
    logits = model(ids)
    assert logits.shape == (2, model.cfg.n_classes) and torch.isfinite(logits).all()


def test_unknown_attention_param_and_variant_are_refused():
    with pytest.raises(ValueError, match="kernel"):
        ClassifierConfig(vocab_size=5, n_classes=2, attention_params={"kernel": 3})
    with pytest.raises(ValueError, match="^n_levels"):
        ClassifierConfig(vocab_size=5, n_classes=2, attention_params={"n_levels": 0})
    with pytest.raises(ValueError, match="^attention"):
        ClassifierConfig(vocab_size=5, n_classes=2, attention="rnn")
    with pytest.raises(KeyError, match="hkt"):
        get_attention_variant("rnn")
    with pytest.raises(ValueError, match="bogus"):
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
