"""Tests of hkt_nb.pretrained (issue 21): `save_pretrained` / `from_pretrained` / `push_to_hub` of HKTClassifier,
the pretrained folder layout (config.json, model.safetensors, README.md: huggingface_hub's PyTorchModelHubMixin
layout), the refusal of damaged folders, loading without executing code, offline loading from a folder and from a
Hub cache, the committed converted models (scripts/migrations/convert_checkpoints.py) and the core requirements."""
import importlib.util
import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hkt_nb.model import ClassifierConfig, HKTClassifier
from hkt_nb.pretrained import CARD_NAME, CONFIG_NAME, FILES_KEY, HUB_EXTRA, PAPER_URL, REPO_URL, WEIGHTS_NAME

SMALL = dict(vocab_size=11, n_classes=3, max_len=32, d_model=16, n_heads=2, n_layers=1)


def small_model(attention: str = "hkt", seed: int = 0) -> HKTClassifier:
    torch.manual_seed(seed)
    model = HKTClassifier(ClassifierConfig(**SMALL, attention=attention)).eval()
    with torch.no_grad():  # move every parameter off its initial value (LayerNorm ones, zero biases)
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def probe(model: HKTClassifier, seed: int = 1):
    "A fixed batch (3, max_len) of token ids and a padding mask (row 1: last 5 padded, row 2: last 11)."
    T = model.cfg.max_len
    ids = torch.randint(0, model.cfg.vocab_size, (3, T), generator=torch.Generator().manual_seed(seed))
    mask = torch.arange(T).expand(3, T) >= torch.tensor([T, T - 5, T - 11]).unsqueeze(1)
    return ids, mask


def logits(model, ids, mask=None):
    with torch.no_grad():
        return model(ids, key_padding_mask=mask)


@pytest.fixture
def saved(tmp_path):
    "(model, folder) of a small HKT model saved with save_pretrained."
    model = small_model()
    return model, model.save_pretrained(tmp_path / "model")


# --- round trip and layout --------------------------------------------------------------------------------------

@pytest.mark.parametrize("attention", ["hkt", "mha"])
def test_round_trip_gives_identical_outputs(attention, tmp_path):
    model = small_model(attention)
    folder = model.save_pretrained(tmp_path / attention)
    loaded = HKTClassifier.from_pretrained(folder)
    assert not loaded.training and loaded.cfg.to_dict() == model.cfg.to_dict()
    ids, mask = probe(model)
    for m in (None, mask):
        assert torch.equal(logits(loaded, ids, m), logits(model, ids, m))
    state = loaded.state_dict()
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_files_read_with_safetensors_and_json_alone(saved):
    model, folder = saved
    assert sorted(p.name for p in folder.iterdir()) == sorted([CONFIG_NAME, WEIGHTS_NAME, CARD_NAME])
    tensors = load_file(folder / WEIGHTS_NAME)  # safetensors' own loader
    state = model.state_dict()
    assert tensors.keys() == state.keys() and all(torch.equal(tensors[k], state[k]) for k in state)
    config = json.loads((folder / CONFIG_NAME).read_text())
    import hashlib
    assert config.pop(FILES_KEY) == {WEIGHTS_NAME: {"bytes": (folder / WEIGHTS_NAME).stat().st_size,
                                                    "sha256": hashlib.sha256((folder / WEIGHTS_NAME).read_bytes()).hexdigest()}}
    assert config == model.cfg.to_dict()
    rebuilt = HKTClassifier(ClassifierConfig(**config))
    rebuilt.load_state_dict(tensors, strict=True)
    ids, _ = probe(model)
    assert torch.equal(logits(rebuilt.eval(), ids), logits(model, ids))


def header(path: Path) -> tuple[dict, bytes]:
    "The JSON header and the data bytes of a safetensors file, read with struct and json."
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def test_layout_is_pytorch_model_hub_mixin_s(saved, tmp_path):
    """The mixin writes config.json as json.dumps(config, sort_keys=True, indent=2) and the weights with
    safetensors.torch.save_model under the names of huggingface_hub.constants; ours are the same bytes (the
    header differs only by our {"format": "pt"} metadata, which transformers' loader expects)."""
    from safetensors.torch import save_model

    model, folder = saved
    saved = json.loads((folder / CONFIG_NAME).read_text())
    expected = {**model.cfg.to_dict(), FILES_KEY: saved[FILES_KEY]}  # plus the record of the weights file
    assert (folder / CONFIG_NAME).read_text() == json.dumps(expected, sort_keys=True, indent=2)
    save_model(model, str(tmp_path / "mixin.safetensors"))
    (ours, our_data), (theirs, their_data) = header(folder / WEIGHTS_NAME), header(tmp_path / "mixin.safetensors")
    assert ours.pop("__metadata__") == {"format": "pt"}
    theirs.pop("__metadata__", None)
    assert ours == theirs and our_data == their_data
    constants = pytest.importorskip("huggingface_hub.constants")
    assert (CONFIG_NAME, WEIGHTS_NAME) == (constants.CONFIG_NAME, constants.SAFETENSORS_SINGLE_FILE)


def test_model_card_from_the_record(tmp_path, settings):
    model = small_model()
    record = {"run": "listops-hkt-cpu-seed7", "task": "listops", "model": "hkt", "preset": "cpu", "seed": 7,
              "test_acc": 0.4321, "n_test_evaluated": 2000, "majority_test_acc": 0.159, "best_val_acc": 0.45,
              "best_epoch": 3, "config": {"model": model.cfg.to_dict()}}
    (tmp_path / "rec.json").write_text(json.dumps(record))
    folder = model.save_pretrained(tmp_path / "m", record=tmp_path / "rec.json", repo_id="someone/listops-hkt")
    card = (folder / CARD_NAME).read_text()
    assert card.startswith("---\nlibrary_name: hkt_nb\nlicense: apache-2.0\n")
    for text in ("# listops-hkt-cpu-seed7", "| task | `listops` |", "| preset | `cpu` |", "| seed | `7` |",
                 "0.4321 on 2,000 test examples", "(epoch 3)", PAPER_URL, 'from_pretrained("someone/listops-hkt")',
                 f"| parameters | {sum(p.numel() for p in model.parameters()):,} |"):
        assert text in card, text
    assert PAPER_URL == settings["paper_url"] and REPO_URL == settings["git_url"]


def test_record_of_another_model_is_refused(tmp_path):
    model = small_model()
    other = {**model.cfg.to_dict(), "d_model": 32}
    with pytest.raises(ValueError, match="record 'r' is of a model with config"):
        model.save_pretrained(tmp_path / "m", record={"run": "r", "config": {"model": other}})


def test_save_replaces_an_existing_folder_s_files(saved):
    model, folder = saved
    other = small_model(seed=3)
    other.save_pretrained(folder)
    ids, _ = probe(model)
    assert torch.equal(logits(HKTClassifier.from_pretrained(folder), ids), logits(other, ids))
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no temporary file left behind


def test_config_from_dict_prefers_the_class_s_from_dict():
    "A config class with `from_dict` (which translates older forms) is read through it; one without refuses unknown keys."
    from dataclasses import dataclass

    from hkt_nb.pretrained import config_from_dict

    @dataclass
    class Plain:
        width: int = 1

    @dataclass
    class Versioned:
        width: int = 1

        @classmethod
        def from_dict(cls, data):
            return cls(width=data.get("width", data.get("old_width")))

    assert config_from_dict(Versioned, {"old_width": 5}) == Versioned(5)
    assert config_from_dict(Plain, {"width": 5}) == Plain(5)
    with pytest.raises(ValueError, match=r"unknown Plain field\(s\) \['old_width'\]"):
        config_from_dict(Plain, {"old_width": 5})
    with pytest.raises(TypeError, match="must be a JSON object"):
        config_from_dict(Plain, [5])


# --- damaged folders ---------------------------------------------------------------------------------------------

def weights(folder) -> dict:
    "The tensors of folder/model.safetensors, copied out of the file's memory map (so the file can be rewritten)."
    return {k: v.clone() for k, v in load_file(folder / WEIGHTS_NAME).items()}


def drop_tensor(folder):
    tensors = weights(folder)
    del tensors["head.bias"]
    save_file(tensors, folder / WEIGHTS_NAME)


def extra_tensor(folder):
    save_file({**weights(folder), "head.scale": torch.ones(3)}, folder / WEIGHTS_NAME)


def wrong_dtype(folder):
    "An integer tensor where the model has a floating one (a floating tensor in another floating dtype loads)."
    tensors = weights(folder)
    save_file({**tensors, "head.weight": tensors["head.weight"].to(torch.int32)}, folder / WEIGHTS_NAME)


def wrong_shape(folder):
    tensors = weights(folder)
    save_file({**tensors, "head.bias": torch.zeros(4)}, folder / WEIGHTS_NAME)


def unknown_field(folder):
    config = json.loads((folder / CONFIG_NAME).read_text())
    (folder / CONFIG_NAME).write_text(json.dumps({**config, "rope_theta": 10000}))


def bad_value(folder):
    config = json.loads((folder / CONFIG_NAME).read_text())
    (folder / CONFIG_NAME).write_text(json.dumps({**config, "n_heads": 3}))


def not_json(folder):
    (folder / CONFIG_NAME).write_text("{'vocab_size': 11")


def corrupt_weights(folder):
    (folder / WEIGHTS_NAME).write_bytes(b"\x07" * 64)


def truncated_weights(folder):
    raw = (folder / WEIGHTS_NAME).read_bytes()
    (folder / WEIGHTS_NAME).write_bytes(raw[: len(raw) - 100])


def pickle_as_weights(folder):
    torch.save(weights(folder), folder / WEIGHTS_NAME)


DAMAGES = [  # (edit, exception, file named, text the message holds)
    (drop_tensor, ValueError, WEIGHTS_NAME, "missing ['head.bias']"),
    (extra_tensor, ValueError, WEIGHTS_NAME, "unexpected ['head.scale']"),
    (wrong_dtype, ValueError, WEIGHTS_NAME, "'head.weight' is int32"),
    (wrong_shape, ValueError, WEIGHTS_NAME, "'head.bias' is float32 (4,), the model expects float32 (3,)"),
    (unknown_field, (TypeError, ValueError), CONFIG_NAME, "rope_theta"),
    (bad_value, ValueError, CONFIG_NAME, "n_heads"),
    (not_json, ValueError, CONFIG_NAME, "not valid JSON"),
    (corrupt_weights, ValueError, WEIGHTS_NAME, "not a readable safetensors file"),
    (truncated_weights, ValueError, WEIGHTS_NAME, "not a readable safetensors file"),
    (pickle_as_weights, ValueError, WEIGHTS_NAME, "not a readable safetensors file"),
    (lambda folder: (folder / CONFIG_NAME).unlink(), FileNotFoundError, CONFIG_NAME, "not found"),
    (lambda folder: (folder / WEIGHTS_NAME).unlink(), FileNotFoundError, WEIGHTS_NAME, "not found"),
]


def drop_files_record(folder):
    "The folder as save_pretrained wrote it before config.json recorded the weights file (the committed folders)."
    config = json.loads((folder / CONFIG_NAME).read_text())
    del config[FILES_KEY]
    (folder / CONFIG_NAME).write_text(json.dumps(config, sort_keys=True, indent=2))


@pytest.mark.parametrize("edit, error, file, text", DAMAGES, ids=[d[0].__name__ for d in DAMAGES])
def test_damaged_folder_gives_an_error_naming_the_file(saved, edit, error, file, text):
    "A folder without the record of its weights file (older saves) is checked tensor by tensor from the header."
    _, folder = saved
    drop_files_record(folder)
    edit(folder)
    with pytest.raises(error) as info:
        HKTClassifier.from_pretrained(folder)
    message = str(info.value)
    assert str(folder / file) in message and text in message, message


def test_missing_folder_and_revision_with_a_folder(saved, tmp_path):
    _, folder = saved
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        HKTClassifier.from_pretrained(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="nor a Hub repository id"):
        HKTClassifier.from_pretrained(str(tmp_path / "no" / "such" / "folder"))
    with pytest.raises(ValueError, match="revision='v1' applies to a Hub repository id"):
        HKTClassifier.from_pretrained(folder, revision="v1")


# --- no code from the files runs --------------------------------------------------------------------------------

class _Touch:
    "Unpickling this runs code: it creates the file `path`."

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def test_loading_never_unpickles(saved, tmp_path, monkeypatch):
    model, folder = saved

    def forbidden(*args, **kwargs):
        raise AssertionError("from_pretrained called a pickle loader")

    for owner, name in ((torch, "load"), (torch.serialization, "load"), (pickle, "load"), (pickle, "loads")):
        monkeypatch.setattr(owner, name, forbidden)
    monkeypatch.setattr(pickle, "Unpickler", forbidden)
    ids, _ = probe(model)
    assert torch.equal(logits(HKTClassifier.from_pretrained(folder), ids), logits(model, ids))
    # a pickle that runs code when unpickled, in place of the weights or the config, is refused and never runs
    marker = tmp_path / "code-ran"
    for name in (WEIGHTS_NAME, CONFIG_NAME):
        damaged = Path(shutil.copytree(folder, tmp_path / f"evil-{name}"))
        (damaged / name).write_bytes(pickle.dumps(_Touch(marker)))
        with pytest.raises(ValueError, match=str(damaged / name)):
            HKTClassifier.from_pretrained(damaged)
    assert not marker.exists()


# --- offline: a folder without huggingface_hub; a Hub cache with HF_HUB_OFFLINE=1 ---------------------------------

def test_folder_loads_without_huggingface_hub_and_hub_calls_name_the_extra(saved, monkeypatch):
    model, folder = saved
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # `import huggingface_hub` raises ImportError
    ids, _ = probe(model)
    assert torch.equal(logits(HKTClassifier.from_pretrained(str(folder)), ids), logits(model, ids))
    with pytest.raises(ImportError, match=r"needs the \[hub\] extra: " + HUB_EXTRA.replace("[", r"\[").replace("]", r"\]")):
        HKTClassifier.from_pretrained("someone/not-a-local-folder")
    with pytest.raises(ImportError, match=r"\[hub\] extra"):
        model.push_to_hub("someone/model")


def test_core_imports_no_hub_client(saved, repo_root):
    "A fresh interpreter imports the core and loads a folder without loading huggingface_hub."
    _, folder = saved
    code = ("import sys\nfrom hkt_nb import HKTClassifier\nimport hkt_nb.pretrained\n"
            f"HKTClassifier.from_pretrained({str(folder)!r})\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('huggingface_hub', 'requests', 'httpx')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=repo_root,
                         env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(repo_root), "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def populate_hub_cache(cache: Path, repo_id: str, folder: Path, commit: str, refs: tuple[str, ...]) -> Path:
    """The Hub cache layout that huggingface_hub's downloads create: `models--<user>--<name>/` with the files in
    blobs/ (named by their sha256), snapshots/<commit>/ links to them, refs/<branch or tag> holding the commit."""
    import hashlib

    from huggingface_hub.file_download import repo_folder_name

    repo = cache / repo_folder_name(repo_id=repo_id, repo_type="model")
    (repo / "blobs").mkdir(parents=True)
    (repo / "snapshots" / commit).mkdir(parents=True)
    for path in folder.iterdir():
        blob = repo / "blobs" / hashlib.sha256(path.read_bytes()).hexdigest()
        shutil.copyfile(path, blob)
        (repo / "snapshots" / commit / path.name).symlink_to(os.path.relpath(blob, repo / "snapshots" / commit))
    for ref in refs:
        (repo / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return repo


def test_from_a_hub_cache_offline(saved, tmp_path, repo_root):
    hub = pytest.importorskip("huggingface_hub")
    model, folder = saved
    commit, repo_id = "0123456789abcdef0123456789abcdef01234567", "hkt-nb/small-test-model"
    cache = tmp_path / "hub-cache"
    populate_hub_cache(cache, repo_id, folder, commit, refs=("main", "v0.1.0"))
    scanned = hub.scan_cache_dir(cache)  # huggingface_hub's own reading of the cache accepts it
    (cached,) = scanned.repos
    assert not scanned.warnings and cached.repo_id == repo_id
    assert [(r.commit_hash, set(r.refs)) for r in cached.revisions] == [(commit, {"main", "v0.1.0"})]
    ids, mask = probe(model)
    save_file({"ids": ids, "mask": mask, "logits": logits(model, ids, mask)}, tmp_path / "expected.safetensors")
    code = f"""
import socket, torch
from safetensors.torch import load_file
def no_network(*args, **kwargs):
    raise AssertionError("network access")
socket.socket.connect = socket.create_connection = no_network
from hkt_nb.model import HKTClassifier
want = load_file({str(tmp_path / 'expected.safetensors')!r})
for revision in (None, "main", "v0.1.0", {commit!r}):
    model = HKTClassifier.from_pretrained({repo_id!r}, revision=revision)
    with torch.no_grad():
        print(revision, torch.equal(model(want["ids"], key_padding_mask=want["mask"]), want["logits"]))
try:
    HKTClassifier.from_pretrained({repo_id!r}, revision="v9.9.9")
except FileNotFoundError as error:
    print("refused", "v9.9.9" in str(error))
"""
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(repo_root), "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "HF_HOME": str(tmp_path / "hf-home")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:5] == ["None True", "main True", "v0.1.0 True", f"{commit} True", "refused True"]


def test_push_to_hub_uploads_the_folder(monkeypatch):
    "push_to_hub through a stand-in huggingface_hub (no network): one upload of the three files, card naming the repo."
    uploads = []

    class FakeApi:
        def __init__(self, token=None):
            self.token = token

        def create_repo(self, repo_id, private=None, exist_ok=False):
            assert exist_ok
            return types.SimpleNamespace(repo_id=repo_id)

        def upload_folder(self, repo_id, folder_path, commit_message, revision=None):
            folder = Path(folder_path)
            uploads.append((repo_id, revision, {p.name: p.read_bytes() for p in folder.iterdir()},
                            HKTClassifier.from_pretrained(folder)))
            return f"https://huggingface.co/{repo_id}/commit/abc"

    monkeypatch.setitem(sys.modules, "huggingface_hub", types.SimpleNamespace(HfApi=FakeApi))
    model = small_model()
    assert model.push_to_hub("someone/hkt-small", branch="dev") == "https://huggingface.co/someone/hkt-small/commit/abc"
    ((repo_id, revision, files, loaded),) = uploads
    assert (repo_id, revision, sorted(files)) == ("someone/hkt-small", "dev", sorted([CONFIG_NAME, WEIGHTS_NAME, CARD_NAME]))
    assert b'from_pretrained("someone/hkt-small")' in files[CARD_NAME]
    ids, _ = probe(model)
    assert torch.equal(logits(loaded, ids), logits(model, ids))


# --- packaging: the core pulls no Hub client ---------------------------------------------------------------------

def test_core_requirements_pull_no_hub_client(settings):
    core = [r.lower() for r in settings["requirements"].split()]
    assert not [r for r in core if r.startswith(("huggingface", "hf-", "hf_"))], core
    assert [r for r in core if r.startswith("safetensors")], core
    assert settings["hub_requirements"].split() == ["huggingface_hub"]


# --- the committed models (scripts/migrations/convert_checkpoints.py) --------------------------------------------------------

@pytest.fixture(scope="module")
def convert_script(repo_root):
    spec = importlib.util.spec_from_file_location("convert_checkpoints", repo_root / "scripts" / "migrations" / "convert_checkpoints.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def committed_checkpoints(repo_root) -> list[Path]:
    return sorted(p for p in (repo_root / "results" / "checkpoints").glob("*.pt") if p.is_file())


def test_every_committed_model_has_an_identical_pretrained_folder(repo_root, convert_script):
    checkpoints = committed_checkpoints(repo_root)
    if not checkpoints:
        pytest.skip("no committed checkpoints")
    for checkpoint in checkpoints:
        folder = repo_root / "results" / "pretrained" / checkpoint.stem
        assert folder.is_dir(), f"{folder} missing: run python scripts/migrations/convert_checkpoints.py"
        reference = HKTClassifier.from_checkpoint(checkpoint)
        assert convert_script.same_model(reference, folder) is None, checkpoint.stem
        record = json.loads((repo_root / "results" / f"{checkpoint.stem}.json").read_text())
        assert f"| test accuracy | {record['test_acc']:.4f}" in (folder / CARD_NAME).read_text()


def test_conversion_is_idempotent_and_skips_run_folders(repo_root, convert_script, tmp_path):
    checkpoints = committed_checkpoints(repo_root)
    if not checkpoints:
        pytest.skip("no committed checkpoints")
    results = tmp_path / "results"
    (results / "checkpoints" / "unfinished-run").mkdir(parents=True)
    shutil.copyfile(checkpoints[0], results / "checkpoints" / checkpoints[0].name)
    shutil.copyfile(checkpoints[0], results / "checkpoints" / "unfinished-run" / "last.pt")
    shutil.copyfile(repo_root / "results" / f"{checkpoints[0].stem}.json", results / f"{checkpoints[0].stem}.json")
    args = ["--results-dir", str(results)]
    assert convert_script.main(args + ["--check"]) == 1  # missing
    assert convert_script.main(args) == 0
    folder = results / "pretrained" / checkpoints[0].stem
    stamps = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    assert convert_script.main(args) == 0 and convert_script.main(args + ["--check"]) == 0
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == stamps  # up to date: not rewritten
    assert sorted(p.name for p in (results / "pretrained").iterdir()) == [checkpoints[0].stem]
    (folder / CARD_NAME).write_text("edited")
    assert convert_script.main(args + ["--check"]) == 1
