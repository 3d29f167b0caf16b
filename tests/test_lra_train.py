"""Tests of hkt_nb.lra.config, .loop and .runs: schedule, optimiser groups, parameter matching, results JSON, exact resume, DDP."""
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from hkt_nb.lra.benchmarks import make_dataloader, synthetic_benchmark
from hkt_nb.lra.config import PRESETS, TASKS, build_config, run_name, run_variant
from hkt_nb.lra.loop import (
    amp_dtype,
    evaluate,
    lr_factor,
    param_groups,
    resolve_device,
    train,
)
from hkt_nb.lra.runs import parse_args
from hkt_nb.model import ClassifierConfig, HKTClassifier, count_parameters

TIMING = ("train_time_s", "train_examples_per_s")


def untimed(history):
    return [{k: v for k, v in h.items() if k not in TIMING} for h in history]


def test_lr_schedule_known_values():
    S, W = 100, 10
    assert lr_factor(0, S, W) == pytest.approx(0.1)  # warm-up starts at 1/W
    assert lr_factor(4, S, W) == pytest.approx(0.5)
    assert lr_factor(W - 1, S, W) == 1.0 and lr_factor(W, S, W) == 1.0  # peak
    assert lr_factor(55, S, W, 0.1) == pytest.approx(0.55)  # half-way down the cosine: (1 + rho) / 2
    assert lr_factor(S, S, W, 0.1) == pytest.approx(0.1) and lr_factor(S + 5, S, W, 0.1) == pytest.approx(0.1)
    assert lr_factor(S, S, W, 0.0) == pytest.approx(0.0, abs=1e-15)
    f = [lr_factor(t, S, W) for t in range(W, S + 1)]
    assert all(a >= b for a, b in zip(f, f[1:]))  # monotone decay after warm-up


def test_param_groups_exclude_norms_biases_embeddings_and_hkt_logits():
    cfg = ClassifierConfig(vocab_size=10, n_classes=3, max_len=16, d_model=16, n_heads=2, n_layers=1)
    m = __import__("hkt_nb.model", fromlist=["HKTClassifier"]).HKTClassifier(cfg)
    decay, plain = param_groups(m, 0.1)
    assert decay["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    ids = lambda g: {id(p) for p in g["params"]}
    assert ids(decay).isdisjoint(ids(plain)) and len(ids(decay) | ids(plain)) == len(list(m.parameters()))
    attn = m.blocks[0].attn
    for p in (m.tok_emb.weight, m.pos_emb.weight, m.norm.weight, m.head.bias, attn.level_logits, attn.gate_logits):
        assert id(p) in ids(plain)
    assert id(m.head.weight) in ids(decay) and id(attn.value_conv.weight) in ids(decay)
    assert all(p.dim() >= 2 for p in decay["params"])


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("task", TASKS)
def test_mha_baseline_is_parameter_matched(task, preset):
    hkt = build_config(task, "hkt", PRESETS[preset], vocab_size=260, n_classes=10)
    mha = build_config(task, "mha", PRESETS[preset], vocab_size=260, n_classes=10)
    assert (hkt.attention, mha.attention) == ("hkt", "mha")
    assert (mha.d_model, mha.n_heads, mha.n_layers, mha.max_len) == (hkt.d_model, hkt.n_heads, hkt.n_layers, hkt.max_len)
    assert abs(count_parameters(mha) - count_parameters(hkt)) <= hkt.n_layers * (2 * hkt.d_model + 1) / 2


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("smoke")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        r = train("synthetic", "hkt", "smoke", 0, device="cpu", results_dir=d / "results",
                  checkpoint_dir=d / "ckpt", progress=False, verbose=False, train_overrides={"save_model": True})
    finally:
        torch.set_num_threads(n)
    return d, r


def test_results_json_schema_and_values(smoke_run):
    d, r = smoke_run
    # save_model is not execution-only, so the run is a variant of the smoke preset, named and recorded as one
    variant = run_variant({"train": {"save_model": True}})
    path = d / "results" / f"{run_name('synthetic', 'hkt', 'smoke', 0, variant)}.json"
    saved = json.loads(path.read_text())
    assert saved["run"] == r["run"] == f"synthetic-hkt-smoke-{variant}-seed0" and saved["preset"] == "smoke"
    assert saved["variant"] == variant and saved["overrides"] == {"train": {"save_model": True}}
    assert saved["test_acc"] == r["test_acc"] and saved["history"] == r["history"]
    for key in ("config", "seed", "history", "best_epoch", "best_val_acc", "test_acc", "n_params", "wall_time_s",
                "train_examples_per_s", "hardware", "versions", "lambdas", "gates", "majority_test_acc"):
        assert key in saved, key
    cfg = ClassifierConfig(**saved["config"]["model"])
    assert saved["n_params"] == count_parameters(cfg)
    tc = saved["config"]["train"]
    assert len(saved["history"]) == tc["epochs"] == PRESETS["smoke"].train.epochs
    assert [h["epoch"] for h in saved["history"]] == list(range(1, tc["epochs"] + 1))
    val = [h["val_acc"] for h in saved["history"]]
    assert saved["best_val_acc"] == max(val) and saved["best_epoch"] == val.index(max(val)) + 1
    assert set(saved["versions"]) >= {"python", "torch", "datasets", "hkt_nb"}
    assert saved["hardware"]["world_size"] == 1 and saved["n_test_evaluated"] == saved["data"]["n_test"] == 128
    # lambdas (n_layers, H, L), rows on the simplex; gates (n_layers, H) in (0, 1)
    lam = torch.tensor(saved["lambdas"])
    assert lam.shape == (cfg.n_layers, cfg.n_heads, cfg.n_levels)
    torch.testing.assert_close(lam.sum(-1), torch.ones(cfg.n_layers, cfg.n_heads))
    g = torch.tensor(saved["gates"])
    assert g.shape == (cfg.n_layers, cfg.n_heads) and ((g > 0) & (g < 1)).all()
    # the synthetic task is easy: the smoke model must learn it (chance 1/4)
    assert saved["test_acc"] > 0.8 and saved["majority_test_acc"] < 0.4
    # the per-epoch checkpoints are removed once the run is complete
    assert not (d / "ckpt" / "last.pt").exists()


def test_test_accuracy_is_that_of_the_saved_best_model(smoke_run, one_thread):
    d, r = smoke_run
    net = HKTClassifier.from_checkpoint(d / "results" / r["model_path"])
    assert net.cfg.to_dict() == r["config"]["model"]
    torch.testing.assert_close(net.blocks[0].attn.lambdas, torch.tensor(r["lambdas"][0]))
    test = synthetic_benchmark()["test"]
    ev = evaluate(net, make_dataloader(test, 64), torch.device("cpu"))
    assert ev["n"] == 128 and ev["acc"] == r["test_acc"]
    assert ev["loss"] == pytest.approx(r["test_loss"], rel=1e-6)


def test_resume_after_interruption_equals_uninterrupted(tmp_path, one_thread):
    kw = dict(device="cpu", progress=False, verbose=False, model_overrides={"dropout": 0.1},  # dropout: RNG matters
              train_overrides={"epochs": 3, "n_train": 128, "n_val": 64, "n_test": 64, "save_model": True})
    full = train("synthetic", "hkt", "smoke", 3, results_dir=tmp_path / "a", checkpoint_dir=tmp_path / "ca", **kw)
    part = train("synthetic", "hkt", "smoke", 3, results_dir=tmp_path / "b", checkpoint_dir=tmp_path / "cb",
                 stop_after=1, **kw)
    assert not part["complete"] and len(part["history"]) == 1 and (tmp_path / "cb" / "last.pt").exists()
    assert not (tmp_path / "b" / f"{part['run']}.json").exists()  # no results file for an unfinished run
    resumed = train("synthetic", "hkt", "smoke", 3, results_dir=tmp_path / "b", checkpoint_dir=tmp_path / "cb", **kw)
    assert resumed["complete"] and untimed(resumed["history"]) == untimed(full["history"])
    assert resumed["test_acc"] == full["test_acc"] and resumed["lambdas"] == full["lambdas"]
    a = torch.load(tmp_path / "a" / full["model_path"], weights_only=True)["state_dict"]
    b = torch.load(tmp_path / "b" / resumed["model_path"], weights_only=True)["state_dict"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resume_refuses_a_different_configuration(tmp_path, one_thread):
    kw = dict(device="cpu", progress=False, verbose=False, results_dir=tmp_path, checkpoint_dir=tmp_path / "c",
              train_overrides={"n_train": 64, "n_val": 32, "n_test": 32})
    train("synthetic", "hkt", "smoke", 0, stop_after=1, **kw)
    with pytest.raises(ValueError, match="different configuration"):
        train("synthetic", "hkt", "smoke", 0, model_overrides={"d_model": 16}, **kw)
    r = train("synthetic", "hkt", "smoke", 0, model_overrides={"d_model": 16}, resume=False, **kw)
    assert r["complete"] and r["config"]["model"]["d_model"] == 16


@pytest.mark.slow
def test_ddp_two_processes_gloo_matches_single_process(tmp_path, smoke_run):
    """torchrun with 2 CPU processes: each takes half of every batch (DistributedSampler), gradients are averaged,
    so without dropout the run equals the single-process one up to rounding."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
           "-m", "hkt_nb.lra.runs", "--task", "synthetic", "--model", "hkt", "--preset", "smoke", "--seed", "0",
           "--device", "cpu", "--results-dir", str(tmp_path / "results"), "--checkpoint-dir", str(tmp_path / "c"),
           "--no-progress"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    files = list((tmp_path / "results").glob("*.json"))
    assert [f.name for f in files] == ["synthetic-hkt-smoke-seed0.json"]  # written once, by rank 0
    r = json.loads(files[0].read_text())
    assert r["hardware"]["world_size"] == 2 and r["n_test_evaluated"] == 128
    single = smoke_run[1]
    for a, b in zip(r["history"], single["history"]):
        for k in ("train_loss", "val_loss", "val_acc", "lr"):
            assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-6), k
    assert r["test_acc"] == pytest.approx(single["test_acc"], abs=1 / 128)


def test_cli_parses_and_rejects():
    a = parse_args(["--task", "imdb", "--model", "mha", "--preset", "cpu", "--seed", "2", "--device", "cuda",
                    "--data-dir", "/x", "--results-dir", "r", "--epochs", "3", "--threads", "1"])
    assert (a.task, a.model, a.preset, a.seed, a.device, a.data_dir, a.results_dir, a.epochs, a.threads) == \
        ("imdb", "mha", "cpu", 2, "cuda", "/x", "r", 3, 1)
    for bad in (["--task", "mnist"], ["--task", "listops", "--model", "rnn"], ["--task", "listops", "--preset", "x"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="preset"):
        train("synthetic", "hkt", "nope")
    with pytest.raises(ValueError, match="model"):
        build_config("listops", "rnn", PRESETS["smoke"], 20, 10)
    with pytest.raises(ValueError, match="device"):
        resolve_device("tpu")


def test_device_and_precision_choice():
    assert resolve_device("cpu") == torch.device("cpu") and amp_dtype(torch.device("cpu")) is None
    assert amp_dtype(torch.device("cpu"), "off") is None
    if not torch.cuda.is_available():
        with pytest.warns(UserWarning, match="CUDA is not available"):
            assert resolve_device("cuda") == torch.device("cpu")
        assert resolve_device("auto") == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the fallback happens only without CUDA")
def test_cuda_without_cuda_warns_once(tmp_path, capsys, one_thread):
    "`hkt-train --device cuda` on a CPU machine: one warning for the whole run, and no second copy printed."
    from hkt_nb.lra.runs import main
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # count every warning issued, not only the first of its kind
        main(["--task", "synthetic", "--device", "cuda", "--epochs", "1", "--threads", "1", "--no-progress",
              "--results-dir", str(tmp_path)])
    fallback = [w for w in caught if "CUDA is not available" in str(w.message)]
    assert len(fallback) == 1 and fallback[0].category is UserWarning
    assert "CUDA is not available" not in capsys.readouterr().err
    [record] = tmp_path.glob("synthetic-hkt-smoke-x*-seed0.json")  # --epochs 1: a variant of the smoke preset
    assert json.loads(record.read_text())["hardware"]["device"] == "cpu"


@pytest.mark.slow
def test_resume_after_sigkill_loses_no_finished_epoch(tmp_path, one_thread):
    """A real kill: SIGKILL the CLI once its first epoch is checkpointed, rerun the same command, and compare
    with an uninterrupted run (same seed, one thread): every epoch's metrics and the test accuracy agree."""
    import signal
    import time

    epochs = 12
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    cmd = [sys.executable, "-m", "hkt_nb.lra.runs", "--task", "synthetic", "--model", "hkt", "--preset", "smoke",
           "--seed", "5", "--device", "cpu", "--epochs", str(epochs), "--threads", "1", "--no-progress",
           "--results-dir", str(tmp_path / "r"), "--checkpoint-dir", str(tmp_path / "c")]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ckpt, deadline = tmp_path / "c" / "last.pt", time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if ckpt.exists() and torch.load(ckpt, weights_only=True)["epoch"] >= 1:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    assert proc.wait(timeout=60) == -signal.SIGKILL, "the run ended before it could be killed"
    killed_at = torch.load(ckpt, weights_only=True)["epoch"]
    assert 1 <= killed_at < epochs and not list((tmp_path / "r").glob("*.json"))  # killed mid-run: no results yet
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"resumed from {ckpt} after epoch {killed_at}" in out.stdout
    name = run_name("synthetic", "hkt", "smoke", 5, run_variant({"train": {"epochs": epochs}}))  # --epochs: a variant
    resumed = json.loads((tmp_path / "r" / f"{name}.json").read_text())
    full = train("synthetic", "hkt", "smoke", 5, device="cpu", epochs=epochs, progress=False, verbose=False,
                 results_dir=tmp_path / "full", checkpoint_dir=tmp_path / "cf")
    assert len(resumed["history"]) == epochs
    for a, b in zip(resumed["history"], full["history"]):
        for k in ("train_loss", "val_loss", "val_acc", "lr"):
            assert a[k] == pytest.approx(b[k], rel=1e-6, abs=1e-9), (a["epoch"], k)
    assert resumed["test_acc"] == full["test_acc"]
