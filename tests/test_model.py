"""Tests of hkt_nb.model and hkt_nb.cost."""
import pytest
import torch

from hkt_nb.cost import score_cost_ratio
from hkt_nb.model import (
    ClassifierConfig,
    HKTClassifier,
    count_parameters,
    masked_mean,
    matched_mha_config,
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
