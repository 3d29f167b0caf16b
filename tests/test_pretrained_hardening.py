"""Tests of issue 35 for hkt_nb.pretrained: saved folders that cannot lie (a save killed at every write step, the
sha256 of the weights in config.json), checks before allocating (configs beyond their weights fail at once, naming
the field), the dtype round trip (stored dtype kept, `torch_dtype=` casts) and offline Hub look-ups that fail fast."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hkt_nb.model import ClassifierConfig, HKTClassifier
from hkt_nb.pretrained import CARD_NAME, CONFIG_NAME, FILES_KEY, WEIGHTS_NAME

SMALL = dict(vocab_size=11, n_classes=3, max_len=32, d_model=16, n_heads=2, n_layers=1)
STEPS = ["weights written", "card written", "config written", "old config removed", f"{WEIGHTS_NAME} in place",
         f"{CARD_NAME} in place", f"{CONFIG_NAME} in place"]


def small_model(seed: int = 0, **changes) -> HKTClassifier:
    torch.manual_seed(seed)
    model = HKTClassifier(ClassifierConfig(**{**SMALL, **changes})).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def same(a: HKTClassifier, b: HKTClassifier) -> bool:
    "Same config and bit-identical tensors."
    sa, sb = a.state_dict(), b.state_dict()
    return a.cfg.to_dict() == b.cfg.to_dict() and sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def without_record(folder: Path) -> Path:
    config = json.loads((folder / CONFIG_NAME).read_text())
    config.pop(FILES_KEY)
    (folder / CONFIG_NAME).write_text(json.dumps(config, sort_keys=True, indent=2))
    return folder


# --- item 2: a save killed at every step ---------------------------------------------------------------------

KILL = """
import os, signal, sys, torch
import hkt_nb.pretrained as pretrained
from hkt_nb.model import HKTClassifier
step = sys.argv[2]
def hook(name):
    if name == step:
        os.kill(os.getpid(), signal.SIGKILL)
pretrained._after_save_step = hook
model = HKTClassifier.from_pretrained(sys.argv[3])
model.save_pretrained(sys.argv[1])
"""


@pytest.mark.parametrize("legacy", [False, True], ids=["old-with-hash", "old-without-hash"])
@pytest.mark.parametrize("step", STEPS + ["never"])
def test_a_save_killed_at_any_step_leaves_the_old_model_the_new_one_or_a_named_error(step, legacy, tmp_path, repo_root):
    old, new = small_model(0), small_model(1, n_classes=4)  # another config and other weights
    target = old.save_pretrained(tmp_path / "model")
    if legacy:
        without_record(target)
    source = new.save_pretrained(tmp_path / "source")
    out = subprocess.run([sys.executable, "-c", KILL, str(target), step, str(source)], capture_output=True, text=True,
                         cwd=repo_root, env={**os.environ, "PYTHONPATH": str(repo_root), "OMP_NUM_THREADS": "1"})
    killed = out.returncode == -signal.SIGKILL
    assert killed == (step != "never"), out.stderr
    try:
        loaded = HKTClassifier.from_pretrained(target)
    except (FileNotFoundError, ValueError) as error:
        message = str(error)
        assert "incomplete" in message and (CONFIG_NAME in message or WEIGHTS_NAME in message), message
        state = "error"
    else:
        state = "old" if same(loaded, old) else "new" if same(loaded, new) else "mix"
    expected = {"weights written": "old", "card written": "old", "config written": "old", "never": "new",
                f"{CONFIG_NAME} in place": "new"}.get(step, "error")
    assert state == expected, (step, state)
    if state == "new":
        assert not [p for p in target.iterdir() if p.name.endswith(".tmp")]


def test_a_later_save_clears_what_a_killed_one_left(tmp_path, repo_root):
    target = small_model(0).save_pretrained(tmp_path / "model")
    source = small_model(1).save_pretrained(tmp_path / "source")
    subprocess.run([sys.executable, "-c", KILL, str(target), "card written", str(source)], cwd=repo_root,
                   env={**os.environ, "PYTHONPATH": str(repo_root), "OMP_NUM_THREADS": "1"})
    assert [p for p in target.iterdir() if p.name.endswith(".tmp")]
    small_model(2).save_pretrained(target)
    assert sorted(p.name for p in target.iterdir()) == sorted([CONFIG_NAME, WEIGHTS_NAME, CARD_NAME])


def test_weights_of_another_save_are_refused_by_the_hash(tmp_path):
    "The issue's case: B's weights under A's config (same architecture), from a copy; and every other edit of the file."
    a = small_model(0).save_pretrained(tmp_path / "a")
    b = small_model(1).save_pretrained(tmp_path / "b")
    shutil.copyfile(b / WEIGHTS_NAME, a / WEIGHTS_NAME)
    with pytest.raises(ValueError, match="is not the weights file .* was saved with .* mixes two saves"):
        HKTClassifier.from_pretrained(a)
    for edit in (lambda raw: raw[:-100], lambda raw: raw[:-1] + bytes([raw[-1] ^ 1]), lambda raw: raw + b"\0"):
        folder = small_model(0).save_pretrained(tmp_path / f"c{len(list(tmp_path.iterdir()))}")
        (folder / WEIGHTS_NAME).write_bytes(edit((folder / WEIGHTS_NAME).read_bytes()))
        with pytest.raises(ValueError, match=str(folder / WEIGHTS_NAME)):
            HKTClassifier.from_pretrained(folder)


def test_a_damaged_files_record_is_refused(tmp_path):
    folder = small_model(0).save_pretrained(tmp_path / "m")
    config = json.loads((folder / CONFIG_NAME).read_text())
    config[FILES_KEY] = {"other": 1}
    (folder / CONFIG_NAME).write_text(json.dumps(config))
    with pytest.raises(ValueError, match="entry is damaged"):
        HKTClassifier.from_pretrained(folder)


def test_every_committed_pretrained_folder_loads(repo_root):
    "The committed folders were written before the hash record: they load, and equal their checkpoint where one exists."
    folders = sorted(p for p in (repo_root / "results" / "pretrained").iterdir() if p.is_dir())
    if not folders:
        pytest.skip("no committed pretrained folders")
    for folder in folders:
        model = HKTClassifier.from_pretrained(folder)
        checkpoint = repo_root / "results" / "checkpoints" / f"{folder.name}.pt"
        if checkpoint.is_file():
            assert same(model, HKTClassifier.from_checkpoint(checkpoint)), folder.name


# --- item 3: check before allocating ---------------------------------------------------------------------------

@pytest.mark.parametrize("field,value", [("vocab_size", 10**9), ("vocab_size", 5 * 10**7), ("max_len", 10**8),
                                         ("d_ff", 10**8), ("n_layers", 3000), ("n_classes", 10**8),
                                         ("d_model", 2**20)])
@pytest.mark.parametrize("record", [True, False], ids=["with-hash", "without-hash"])
def test_a_config_beyond_its_weights_fails_at_once_naming_the_field(field, value, record, tmp_path):
    folder = small_model(0).save_pretrained(tmp_path / "m")
    if not record:
        without_record(folder)
    config = json.loads((folder / CONFIG_NAME).read_text())
    config[field] = value
    if field == "d_model":
        config["d_ff"] = 4 * value
    (folder / CONFIG_NAME).write_text(json.dumps(config))
    start = time.perf_counter()
    with pytest.raises(ValueError) as info:
        HKTClassifier.from_pretrained(folder)
    assert time.perf_counter() - start < 1.0
    assert f"{field} = {value:,}" in str(info.value), str(info.value)


# --- item 4: the dtype round trip ------------------------------------------------------------------------------

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_folder_saved_in_any_floating_dtype_loads_in_that_dtype(dtype, tmp_path):
    model = small_model(0).to(dtype)
    folder = model.save_pretrained(tmp_path / "m")
    assert {t.dtype for t in load_file(folder / WEIGHTS_NAME).values()} == {dtype}
    loaded = HKTClassifier.from_pretrained(folder)
    assert same(loaded, model) and {p.dtype for p in loaded.parameters()} == {dtype}
    ids = torch.randint(0, 11, (2, 9))
    with torch.no_grad():
        assert torch.equal(loaded(ids), model(ids))


@pytest.mark.parametrize("stored", DTYPES, ids=str)
@pytest.mark.parametrize("wanted", DTYPES + ["bfloat16", "auto"], ids=str)
def test_torch_dtype_casts_the_loaded_model(stored, wanted, tmp_path):
    model = small_model(0).to(stored)
    folder = model.save_pretrained(tmp_path / "m")
    loaded = HKTClassifier.from_pretrained(folder, torch_dtype=wanted)
    dtype = stored if wanted == "auto" else getattr(torch, wanted) if isinstance(wanted, str) else wanted
    assert {p.dtype for p in loaded.parameters()} == {dtype}
    state = loaded.state_dict()
    assert all(torch.equal(state[k], v.to(dtype)) for k, v in model.state_dict().items())


@pytest.mark.parametrize("bad", [torch.int64, "int8", "floatx", 3])
def test_torch_dtype_must_be_floating(bad, tmp_path):
    folder = small_model(0).save_pretrained(tmp_path / "m")
    with pytest.raises(ValueError, match="torch_dtype must be"):
        HKTClassifier.from_pretrained(folder, torch_dtype=bad)


def test_mixed_floating_dtypes_are_kept_per_tensor(tmp_path):
    model = small_model(0)
    folder = model.save_pretrained(tmp_path / "m")
    tensors = {k: v.clone() for k, v in load_file(folder / WEIGHTS_NAME).items()}
    tensors["head.weight"] = tensors["head.weight"].double()
    save_file(tensors, folder / WEIGHTS_NAME)
    without_record(folder)
    loaded = HKTClassifier.from_pretrained(folder)
    assert loaded.head.weight.dtype == torch.float64 and loaded.head.bias.dtype == torch.float32


def test_a_tied_model_saves_each_tensor_once_and_loads_tied(tmp_path):
    "The mechanism is generic over the config class: a model with a tied head (as a language model has) round-trips."
    from dataclasses import dataclass

    from hkt_nb.pretrained import PretrainedMixin

    @dataclass
    class TiedConfig:
        vocab_size: int = 7
        d_model: int = 4

    class Tied(PretrainedMixin, torch.nn.Module):
        def __init__(self, cfg: TiedConfig):
            super().__init__()
            self.cfg = cfg
            self.emb = torch.nn.Embedding(cfg.vocab_size, cfg.d_model)
            self.head = torch.nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
            self.head.weight = self.emb.weight

    torch.manual_seed(0)
    model = Tied(TiedConfig()).to(torch.bfloat16)
    folder = model.save_pretrained(tmp_path / "tied")
    assert sorted(load_file(folder / WEIGHTS_NAME)) == ["emb.weight"]
    loaded = Tied.from_pretrained(folder)
    assert loaded.head.weight is loaded.emb.weight and loaded.emb.weight.dtype == torch.bfloat16
    assert torch.equal(loaded.emb.weight, model.emb.weight)


# --- item 8: an offline Hub look-up fails fast ------------------------------------------------------------------

LOOKUP = """
import time
from hkt_nb.model import HKTClassifier
start = time.perf_counter()
try:
    HKTClassifier.from_pretrained("someone/not-here")
except FileNotFoundError as error:
    print(round(time.perf_counter() - start, 2))
    print(error)
"""


@pytest.mark.parametrize("env", [{"HF_HUB_OFFLINE": "1"}, {"HF_ENDPOINT": "http://127.0.0.1:9"}],
                         ids=["HF_HUB_OFFLINE", "unreachable"])
def test_an_offline_hub_look_up_fails_fast_and_says_how_to_load_a_folder(env, tmp_path, repo_root):
    pytest.importorskip("huggingface_hub")
    base = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    out = subprocess.run([sys.executable, "-c", LOOKUP], capture_output=True, text=True, cwd=tmp_path,
                         env={**base, **env, "PYTHONPATH": str(repo_root), "HF_HOME": str(tmp_path / "hf"),
                              "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    seconds, message = out.stdout.split("\n", 1)
    assert float(seconds) < 3.0, seconds
    assert "to load a local folder instead, pass its path" in message and "someone/not-here" in message, message


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_byte_lm_with_the_mixin_round_trips_in_every_dtype(dtype, tmp_path):
    "The byte LM (a PretrainedMixin, chapter 15a): its tied head saved once and loaded tied, in every floating dtype."
    from hkt_nb.lm import ByteLM, LMConfig

    torch.manual_seed(0)
    model = ByteLM(LMConfig(d_model=16, n_heads=2, n_layers=2, max_len=32)).to(dtype).eval()
    loaded = ByteLM.from_pretrained(model.save_pretrained(tmp_path / "lm"))
    assert loaded.head.weight is loaded.tok_emb.weight and {p.dtype for p in loaded.parameters()} == {dtype}
    assert loaded.cfg.to_dict() == model.cfg.to_dict()
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values()))
