"""The language model as a package (issue 31 item 2): `hkt_nb.lm` is split into modules of at most about 500 lines
that keep every public name of the former `hkt_nb.lm` module; a run killed by SIGKILL after its first checkpoint
resumes to the record of an uninterrupted run (timing apart); `ByteLM.save_pretrained` / `from_pretrained` give
back the same logits, also for a model `run_lm` trained; the sliding-window variant serves a classifier too; the
package reaches `hkt_nb.lra` only through its marked, redirectable imports."""
import json
import math
import os
import re
import signal
import subprocess
import sys

import pytest
import torch

import hkt_nb.lm as lm
from hkt_nb.lm import (
    ByteLM,
    LMConfig,
    LMTrainConfig,
    SlidingWindowAttention,
    default_decoder,
    eval_windows,
    generate,
    lm_pretrained_dir,
    lr_at,
    sequence_bits_per_byte,
    train_lm,
    without_timing,
)
from hkt_nb.pretrained import read_config
from hkt_nb.train.checkpoints import RunLockedError, run_lock
from hkt_nb.model import ClassifierConfig, HKTClassifier

# every public name of the former module hkt_nb/lm.py (its __all__), which users, tests and chapters import
FORMER_NAMES = """RECORD_VERSION LM_MODELS LM_SEEDS LM_PRESETS NGRAM_ORDERS NGRAM_ALPHAS MAX_NGRAM_ORDER NGRAM_RECORD_VERSION
LM_VERDICT_RULES LM_PAIRS window_mask WindowParams SlidingWindowAttention LMConfig ByteLM configure_optimizer
count_lm_parameters imdb_bytes as_tensor random_batch eval_windows lm_loss sequence_bits_per_byte LMTrainConfig lr_at
train_lm save_record load_record RecomputeDecoder generate generation_ms_per_token WindowKVCache CachedDecoder
default_decoder LMPreset match_lm_parameters lm_model_config lm_run_name default_lm_results_dir run_lm load_lm_runs
compare_lm ByteNGram fit_byte_ngram interpolated_ngram_probability ngram_window_counts ngram_bits_per_byte
ngram_distribution fit_ngram_baselines ngram_settings ngram_baselines lm_learned_the_task counted_lm_verdict
lm_comparisons lm_established_sentence""".split()


def test_the_former_names_are_exported(repo_root):
    missing = [name for name in FORMER_NAMES if not hasattr(lm, name)]
    assert missing == []
    assert set(FORMER_NAMES) <= set(lm.__all__)
    assert not (repo_root / "hkt_nb" / "lm.py").exists()  # the package replaces the module


def test_no_module_of_the_package_is_over_500_lines(repo_root):
    sizes = {p.name: len(p.read_text().splitlines()) for p in (repo_root / "hkt_nb" / "lm").glob("*.py")}
    assert {"__init__.py", "model.py", "data.py", "generation.py", "training.py", "runs.py", "ngram.py",
            "verdicts.py"} <= set(sizes)
    assert max(sizes.values()) <= 500, sizes


def test_the_package_imports_no_lra_module(repo_root):
    """The language model imports no hkt_nb.lra module (issue 31): its training pieces come from the training core
    hkt_nb.train, its verdict rules from hkt_nb.stats. Every import is read, also those inside functions."""
    import ast

    found = []
    for path in sorted((repo_root / "hkt_nb" / "lm").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            module = ("." * node.level + (node.module or "")) if isinstance(node, ast.ImportFrom) else ""
            if any(n.startswith("hkt_nb.lra") for n in names) or "lra" in module.split("."):
                found.append((path.name, node.lineno, module or names))
    assert found == []


def test_lr_at_is_the_former_schedule():
    "Known answer: the former formula (warm-up (s+1)/W lr, cosine from lr to min_lr over steps W..S-1), to 1e-15."
    cfg = LMTrainConfig(steps=50, lr=3e-3, warmup=5, min_lr=1e-4)

    def former(step):
        if step < cfg.warmup:
            return cfg.lr * (step + 1) / cfg.warmup
        progress = (step - cfg.warmup) / max(1, cfg.steps - 1 - cfg.warmup)
        return cfg.min_lr + 0.5 * (1 + math.cos(math.pi * min(1.0, progress))) * (cfg.lr - cfg.min_lr)

    for step in range(cfg.steps + 3):
        assert lr_at(step, cfg) == pytest.approx(former(step), rel=1e-15, abs=0)
    assert lr_at(cfg.steps - 1, cfg) == pytest.approx(cfg.min_lr, rel=1e-15)


def _perturbed(cfg: LMConfig) -> ByteLM:
    torch.manual_seed(0)
    model = ByteLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.eval()


@pytest.mark.parametrize("attention, params", [("hkt", {"n_levels": 3}), ("mha", {}), ("mha_window", {"window": 5})])
def test_save_pretrained_then_from_pretrained_gives_identical_logits(tmp_path, attention, params, one_thread):
    cfg = LMConfig(d_model=16, n_heads=2, n_layers=2, max_len=32, attention=attention, attention_params=params)
    model = _perturbed(cfg)
    folder = model.save_pretrained(tmp_path / "lm", record={"run": "toy", "model": attention, "val_bpb": 5.0,
                                                            "sequence_bpb": [5.0]})
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    assert read_config(folder / "config.json", LMConfig) == cfg  # the config, beside the weights' size and hash
    from safetensors import safe_open

    from hkt_nb.pretrained import FILES_KEY
    assert FILES_KEY in json.loads((folder / "config.json").read_text())
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        assert "tok_emb.weight" in f.keys() and "head.weight" not in f.keys()  # the tied head, stored once
    loaded = ByteLM.from_pretrained(folder)
    assert not loaded.training and loaded.head.weight is loaded.tok_emb.weight
    x = torch.randint(0, 256, (3, 32))
    assert torch.equal(loaded(x), model(x))
    card = (folder / "README.md").read_text()
    assert "ByteLM.from_pretrained" in card and "text-generation" in card and "5.0000" in card


def test_a_classifier_uses_the_sliding_window_variant(one_thread):
    "The variant is in the core's registry: a (bidirectional) classifier built from a ClassifierConfig uses it."
    torch.manual_seed(0)
    cfg = ClassifierConfig(vocab_size=20, n_classes=3, max_len=12, d_model=8, n_heads=2, n_layers=1,
                           attention="mha_window", attention_params={"window": 3})
    model = HKTClassifier(cfg).double().eval()
    layer = model.blocks[0].attn
    assert isinstance(layer, SlidingWindowAttention) and layer.window == 3 and not layer.causal
    x = torch.randn(2, 12, 8, dtype=torch.float64)
    out = layer(x)
    changed = x.clone()
    changed[:, 9:] += 1.0  # positions 9.. lie outside the band |i - j| < 3 of queries 0..6
    assert torch.allclose(layer(changed)[:, :7], out[:, :7], atol=1e-12)
    assert not torch.allclose(layer(changed)[:, 7:], out[:, 7:])
    assert model(torch.randint(1, 20, (2, 12))).shape == (2, 3)


TOY = """
import sys, time
import numpy as np, torch
torch.set_num_threads(1)
from hkt_nb.lm import LM_PRESETS, LMConfig, LMPreset, LMTrainConfig, run_lm
LM_PRESETS["toy"] = LMPreset(LMConfig(d_model=16, n_heads=2, n_layers=1, max_len=16, dropout=0.1),
                             LMTrainConfig(steps=12, batch_size=4, lr=3e-3, warmup=2, eval_every=4, eval_windows=4,
                                           final_windows=8, sample_tokens=8), window=4, seeds=(0,))
rng = np.random.default_rng(0)
data = (rng.integers(0, 256, 4000, dtype=np.uint8).tobytes(), rng.integers(0, 256, 600, dtype=np.uint8).tobytes())
mode, results = sys.argv[1], sys.argv[2]

def log(line):
    print(line, flush=True)
    if mode == "stall" and line.startswith("step") and line.split()[1] == "4:":  # the first checkpoint is written
        time.sleep(600)  # the parent kills this process here

run_lm(["hkt_l2"], "toy", results_dir=results, data=data, log=log)
"""


def _toy(mode, results, wait=True):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    proc = subprocess.Popen([sys.executable, "-c", TOY, mode, str(results)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    if wait:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        return out
    return proc


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory):
    "A toy run SIGKILLed after its first checkpoint and then resumed, and the same run uninterrupted."
    killed, fresh = tmp_path_factory.mktemp("killed"), tmp_path_factory.mktemp("fresh")
    proc = _toy("stall", killed, wait=False)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("step") and line.split()[1] == "4:":
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, (lines, proc.stderr.read())
    name = "lm-hkt_l2-toy-seed0"
    at_kill = {"checkpoint": (killed / "checkpoints" / f"{name}.pt").is_file(), "record": (killed / f"{name}.json").exists()}
    resumed_log = _toy("resume", killed)
    _toy("fresh", fresh)
    return {"killed": killed, "fresh": fresh, "name": name, "at_kill": at_kill, "resumed_log": resumed_log}


@pytest.mark.slow
def test_a_run_killed_mid_training_resumes_to_the_uninterrupted_record(killed_and_resumed):
    k = killed_and_resumed
    assert k["at_kill"] == {"checkpoint": True, "record": False}
    assert "resumed from" in k["resumed_log"] and "after step 4" in k["resumed_log"]
    assert "step      4:" not in k["resumed_log"]  # steps 1-4 are not trained again
    resumed = json.loads((k["killed"] / f"{k['name']}.json").read_text())
    fresh = json.loads((k["fresh"] / f"{k['name']}.json").read_text())
    assert [h["step"] for h in resumed["history"]] == [4, 8, 12]
    assert without_timing(resumed) == without_timing(fresh)  # bit for bit: losses, curve, per-window bpb, sample
    assert set(resumed) - set(without_timing(resumed)) == {"tokens_per_s", "tokens_per_cpu_s"}
    assert not (k["killed"] / "checkpoints" / f"{k['name']}.pt").exists()  # removed once the run finished
    assert not (k["killed"] / f"{k['name']}.lock").exists()


@pytest.mark.slow
def test_from_pretrained_loads_the_model_run_lm_trained(killed_and_resumed, one_thread):
    "The saved model of a trained run scores the held-out windows exactly as its record says; both runs saved the same weights."
    k = killed_and_resumed
    record = json.loads((k["killed"] / f"{k['name']}.json").read_text())
    model = ByteLM.from_pretrained(lm_pretrained_dir(k["killed"], k["name"]))
    assert model.cfg.to_dict() == record["config"]
    import numpy as np
    rng = np.random.default_rng(0)
    rng.integers(0, 256, 4000, dtype=np.uint8)
    held_out = torch.from_numpy(rng.integers(0, 256, 600, dtype=np.uint8))
    windows = eval_windows(held_out, model.cfg.max_len, record["train"]["final_windows"])
    assert sequence_bits_per_byte(model, windows).tolist() == pytest.approx(record["sequence_bpb"], rel=1e-12)
    other = ByteLM.from_pretrained(lm_pretrained_dir(k["fresh"], k["name"]))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values()))
    assert record["run"] in (lm_pretrained_dir(k["killed"], k["name"]) / "README.md").read_text()


def test_a_checkpoint_of_another_run_is_refused(tmp_path, one_thread):
    cfg = LMConfig(d_model=8, n_heads=2, n_layers=1, max_len=8, attention="mha")
    train = LMTrainConfig(steps=4, batch_size=2, warmup=1, eval_every=2, eval_windows=2, final_windows=2, sample_tokens=2)
    data = bytes(range(256)) * 2
    checkpoint = tmp_path / "run.pt"
    _, first = train_lm(cfg, train, data, data, seed=0, checkpoint=checkpoint)
    assert checkpoint.is_file()  # train_lm keeps it; run_lm removes it after writing the record and the model
    _, again = train_lm(cfg, train, data, data, seed=0, checkpoint=checkpoint)  # resumes after the last step
    assert without_timing(again) == without_timing(first)
    with pytest.raises(ValueError, match=r"belongs to another run \(differs in \['seed'\]\)"):
        train_lm(cfg, train, data, data, seed=1, checkpoint=checkpoint)
    checkpoint.write_bytes(b"not a checkpoint")
    with pytest.raises(RuntimeError, match="cannot be read"):
        train_lm(cfg, train, data, data, seed=0, checkpoint=checkpoint)


def test_a_second_process_on_the_same_run_is_refused(tmp_path):
    name = "lm-mha-smoke-seed0"
    with run_lock(tmp_path / f"{name}.lock", name):  # a live training of the run (this process holds the lock)
        with pytest.raises(RunLockedError, match=name):
            lm.run_lm(["mha"], "smoke", results_dir=tmp_path, data=(b"x" * 500, b"y" * 500), log=None)
    assert not (tmp_path / f"{name}.json").exists()


# --- generation's arguments (issue 35, item 6): every sampling argument, every prompt dtype, the mode restored -------

def _tiny_lm():
    torch.manual_seed(0)
    return _perturbed(LMConfig(d_model=16, n_heads=2, n_layers=1, max_len=32))


@pytest.mark.parametrize("temperature", [1e-40, 5e-324, 1e-300])
def test_a_temperature_that_overflows_is_greedy(temperature, one_thread):
    model, prompt = _tiny_lm(), torch.tensor([[65, 66, 67]])
    greedy = generate(model, prompt, 6, temperature=0.0)
    assert torch.equal(generate(model, prompt, 6, temperature=temperature), greedy)
    assert torch.equal(generate(model, prompt, 6, temperature=temperature, top_k=3), greedy)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64])
def test_any_integer_prompt_dtype_gives_the_same_bytes(dtype, one_thread):
    model, prompt = _tiny_lm(), torch.tensor([[65, 66, 67]])
    out = generate(model, prompt.to(dtype), 5, temperature=0.0)
    assert out.dtype == torch.int64 and torch.equal(out, generate(model, prompt, 5, temperature=0.0))


@pytest.mark.parametrize("bad, error, words", [
    (torch.tensor([[1.0, 2.0]]), TypeError, "integer byte ids"),
    (torch.tensor([[True, False]]), TypeError, "integer byte ids"),
    (torch.tensor([1, 2]), TypeError, "(B, T0)"),
    (torch.zeros(1, 0, dtype=torch.long), TypeError, "(B, T0)"),
    (torch.tensor([[1, 256]]), ValueError, "ids in [0, 256)"),
    (torch.tensor([[-1, 2]], dtype=torch.int16), ValueError, "ids in [0, 256)"),
])
def test_a_bad_prompt_is_named(bad, error, words, one_thread):
    with pytest.raises(error, match=re.escape(words)):
        generate(_tiny_lm(), bad, 2)


class _Interrupting:
    "A decoder whose step raises: generate must give the model its mode back."
    def __init__(self, model, exc):
        self.inner, self.exc = default_decoder(model), exc

    def prefill(self, idx):
        return self.inner.prefill(idx)

    def step(self, idx, token):
        raise self.exc


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), RuntimeError("boom")])
def test_generate_restores_the_train_mode_after_an_error(exc, one_thread):
    model = _tiny_lm().train()
    with pytest.raises(type(exc)):
        generate(model, torch.tensor([[65, 66]]), 4, decoder=_Interrupting(model, exc))
    assert model.training
    model.eval()
    with pytest.raises(type(exc)):
        generate(model, torch.tensor([[65, 66]]), 4, decoder=_Interrupting(model, exc))
    assert not model.training


def test_non_finite_logits_are_named_not_sampled(one_thread):
    model = _tiny_lm()
    with torch.no_grad():
        model.head.weight.fill_(float("nan"))
    with pytest.raises(ValueError, match="non-finite logits"):
        generate(model, torch.tensor([[65]]), 2)
