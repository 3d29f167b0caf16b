"""Tests of hkt_nb.lra.loop and hkt_nb.train.optim: the schedule, the optimiser groups, the results of a smoke run, the driver's errors, and
an arm registered in the test and trained for one smoke epoch."""
import json

import datasets
import pytest
import torch

from hkt_nb.lra.benchmarks import make_dataloader, synthetic_benchmark
from hkt_nb.lra.config import ARMS, PRESETS, Arm, run_name, run_variant
from hkt_nb.lra.loop import evaluate, train
from hkt_nb.train.optim import lr_factor, param_groups
from hkt_nb.model import ClassifierConfig, HKTClassifier, count_parameters

QUIET = dict(device="cpu", progress=False, verbose=False)


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
    # the tested checkpoint is the lowest validation loss (the first of a tie), not the highest accuracy (issue 23)
    losses = [h["val_loss"] for h in saved["history"]]
    assert saved["selection"] == "val_loss" and saved["best_epoch"] == losses.index(min(losses)) + 1
    assert saved["best_val_loss"] == min(losses)
    assert saved["best_val_acc"] == saved["history"][saved["best_epoch"] - 1]["val_acc"]
    assert saved["final_epoch"] == len(saved["history"]) and 0 <= saved["final_test_acc"] <= 1
    assert saved["final_test_loss"] > 0 and saved["results_version"] == 2
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


def test_the_final_model_is_scored_beside_the_tested_one(tmp_path, monkeypatch, one_thread):
    """`final_test_acc` / `final_test_loss` are the test scores of the model as the last epoch left it, the tested
    ones (`test_acc`, predictions) those of the lowest validation loss: with the validation losses forced to rise,
    epoch 1 is tested, and the final scores equal those of the model saved after the last epoch."""
    from hkt_nb.lra import loop

    real_evaluate, calls = loop.evaluate, {"validation": 0}

    def rising_validation_loss(model, loader, device, dtype=None, predictions=False):
        out = real_evaluate(model, loader, device, dtype, predictions)
        if loader is run_loaders["validation"]:
            calls["validation"] += 1
            out["loss"] = float(calls["validation"])  # 1, 2, 3: epoch 1 is the best by validation loss
        return out

    real_build = loop.build_run
    run_loaders, final_states = {}, []

    def build_and_keep(spec, options):
        run = real_build(spec, options)
        run_loaders.update(run.loaders)
        return run

    real_save = loop.save_checkpoint

    def save_and_keep(run, epoch):
        real_save(run, epoch)
        final_states.append({k: v.detach().clone() for k, v in run.model.state_dict().items()})

    monkeypatch.setattr(loop, "evaluate", rising_validation_loss)
    monkeypatch.setattr(loop, "build_run", build_and_keep)
    monkeypatch.setattr(loop, "save_checkpoint", save_and_keep)
    record = loop.train("synthetic", epochs=3, results_dir=tmp_path, **QUIET,
                        train_overrides={"n_train": 64, "n_val": 32, "n_test": 32, "save_model": True})
    assert record["best_epoch"] == 1 and record["best_val_loss"] == 1.0 and record["final_epoch"] == 3
    final = HKTClassifier(ClassifierConfig.from_dict(record["config"]["model"]))
    final.load_state_dict(final_states[-1])
    best = HKTClassifier.from_checkpoint(tmp_path / record["model_path"])
    scores = [real_evaluate(net, run_loaders["test"], torch.device("cpu")) for net in (final, best)]
    assert (scores[0]["acc"], scores[0]["loss"]) == pytest.approx((record["final_test_acc"], record["final_test_loss"]))
    assert (scores[1]["acc"], scores[1]["loss"]) == pytest.approx((record["test_acc"], record["test_loss"]))
    assert not torch.equal(final_states[-1]["head.weight"], best.state_dict()["head.weight"])  # two models


def test_train_names_a_missing_split(tmp_path):
    toy = synthetic_benchmark(n_train=16, n_val=8, n_test=8, seq_len=16)
    for missing in ("validation", "test", "train"):
        partial = datasets.DatasetDict({k: v for k, v in toy.items() if k != missing})
        with pytest.raises(ValueError, match=f"dataset.*{missing}"):
            train("synthetic", dataset=partial, results_dir=tmp_path / "r", **QUIET)


def test_epochs_given_to_train_is_honoured(tmp_path):
    record = train("synthetic", epochs=1, results_dir=tmp_path, **QUIET,
                   train_overrides={"n_train": 32, "n_val": 16, "n_test": 16})
    assert len(record["history"]) == 1 and record["config"]["train"]["epochs"] == 1


def test_an_arm_registered_here_trains_for_one_smoke_epoch(tmp_path, one_thread, temporary_arm):
    "An arm is one registry entry: HKT with stride 3, widened to HKT's size, trained by name like the built-in ones."
    temporary_arm(Arm("hkt_s3", "hkt", {"stride": 3}, matched_to="hkt", why="a test arm"))
    record = train("synthetic", "hkt_s3", "smoke", 0, epochs=1, results_dir=tmp_path, **QUIET)
    variant = run_variant({"train": {"epochs": 1}})
    assert record["run"] == run_name("synthetic", "hkt_s3", "smoke", 0, variant) and record["complete"]
    config = ClassifierConfig.from_dict(record["config"]["model"])
    assert config.attention == "hkt" and config.attention_params["stride"] == 3
    reference = train("synthetic", "hkt", "smoke", 0, epochs=1, results_dir=tmp_path, **QUIET)
    assert abs(record["n_params"] - reference["n_params"]) <= config.n_layers * (2 * config.d_model + 1) / 2
    assert len(record["lambdas"]) == config.n_layers and len(record["history"]) == 1
    assert (tmp_path / f"{record['run']}.json").is_file() and "hkt_s3" in ARMS


def test_datasets_progress_turns_the_bars_off_inside_only_and_restores_them():
    import datasets

    from hkt_nb.lra.loop import datasets_progress

    assert not datasets.are_progress_bars_disabled()
    with datasets_progress(False):
        assert datasets.are_progress_bars_disabled()
    assert not datasets.are_progress_bars_disabled()
    with datasets_progress(True):
        assert not datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()  # a user who turned them off keeps them off
    try:
        with datasets_progress(False):
            pass
        assert datasets.are_progress_bars_disabled()
    finally:
        datasets.enable_progress_bars()


@pytest.mark.slow
def test_no_progress_prints_no_bar_at_all(tmp_path, repo_root):
    """`hkt-train --no-progress` on a cold cache (the data is generated and tokenised): no progress bar on stderr,
    neither the loop's nor the `datasets` library's ("tokenising", "Saving the dataset")."""
    import os
    import re
    import subprocess
    import sys

    env = {**os.environ, "HKT_CACHE_DIR": str(tmp_path / "cache"), "HF_DATASETS_CACHE": str(tmp_path / "hf"),
           "OMP_NUM_THREADS": "1", "PYTHONPATH": str(repo_root)}
    env.pop("HF_DATASETS_DISABLE_PROGRESS_BARS", None)
    env.pop("TQDM_DISABLE", None)
    out = subprocess.run([sys.executable, "-m", "hkt_nb.lra.runs", "--task", "listops", "--model", "hkt", "--preset",
                          "smoke", "--seed", "0", "--epochs", "1", "--threads", "1", "--no-progress",
                          "--results-dir", str(tmp_path / "r")], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    bars = re.findall(r"\d+%\|", out.stderr + out.stdout)
    assert bars == [] and "tokenising" not in out.stderr, out.stderr[-2000:]
