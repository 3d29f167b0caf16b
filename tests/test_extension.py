"""A variant of your own (what a new user met, issue 31's check): `hkt-train --import` sees the arms a module
registers, the language model takes a registered model (`register_lm_model`), and an unregistered variant's error
says to register it."""
import pytest

from hkt_nb.lra.config import ARMS
from hkt_nb.lra.runs import parse_args
from hkt_nb.model import ATTENTION_VARIANTS, ClassifierConfig

PLUGIN = '''
from dataclasses import dataclass

from torch import nn
from hkt_nb.lra.config import Arm, register_arm
from hkt_nb.model import register_attention


class Mean(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x, key_padding_mask=None, impl="fused"):
        return self.out_proj(x.mean(1, keepdim=True).expand_as(x))


@dataclass(frozen=True)
class MeanParams:
    pass


register_attention("toy_mean", lambda d_model, n_heads, causal, attn_dropout, p: Mean(d_model), MeanParams)
register_arm(Arm("toy_mean", "toy_mean", {}, matched_to="hkt", why="a test's toy variant"))
'''


@pytest.fixture
def plugin(tmp_path):
    path = tmp_path / "toy_plugin.py"
    path.write_text(PLUGIN)
    yield path
    ARMS.pop("toy_mean", None), ATTENTION_VARIANTS.pop("toy_mean", None)


def test_hkt_train_imports_a_file_that_registers_an_arm(plugin):
    with pytest.raises(SystemExit):  # not registered yet: argparse refuses the choice
        parse_args(["--task", "listops", "--model", "toy_mean"])
    args = parse_args(["--import", str(plugin), "--task", "listops", "--model", "toy_mean"])
    assert args.model == "toy_mean" and args.imports == [str(plugin)] and "toy_mean" in ATTENTION_VARIANTS


def test_hkt_train_names_an_import_it_cannot_find(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--import", str(tmp_path / "missing.py"), "--task", "listops"])
    assert "no such Python file" in capsys.readouterr().err


def test_an_unregistered_variant_says_to_register_it():
    with pytest.raises(ValueError, match="register yours with register_attention .* before building or loading"):
        ClassifierConfig(vocab_size=8, n_classes=2, max_len=16, d_model=16, n_heads=2, attention="not_registered")


def test_register_lm_model_adds_a_model_run_lm_accepts(plugin):
    from hkt_nb.lm import LM_MODELS, lm_model_config, register_lm_model

    parse_args(["--import", str(plugin), "--task", "listops"])  # registers the variant
    try:
        assert register_lm_model("toy_mean", "toy_mean") == "toy_mean" and LM_MODELS["toy_mean"] == ("toy_mean", {})
        cfg = lm_model_config("toy_mean", "smoke")
        assert cfg.attention == "toy_mean"
        with pytest.raises(ValueError, match="already a language model"):
            register_lm_model("mha", "toy_mean")
        with pytest.raises(ValueError, match="not a registered attention variant"):
            register_lm_model("toy_other", "nope")
    finally:
        LM_MODELS.pop("toy_mean", None)
