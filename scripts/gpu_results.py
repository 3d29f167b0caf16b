#!/usr/bin/env python
"""ListOps at the paper's length on one lent GPU: HKT and MHA, one seed each, under a stated time budget.

    python scripts/gpu_results.py prepare            # on the CPU, beforehand: the data, into _build/gpu_carry/
    python scripts/gpu_results.py train              # on the GPU (`make gpu-results`): results/gpu/accuracy/
    python scripts/gpu_results.py dry-run            # both on the CPU at toy size (part of `make gpu-check-dry`)

`prepare` (on the CPU) generates and tokenises the `paper` preset's ListOps splits (setting "paper", T = 512: 96,000 training,
2,000 validation and 10,000 test expressions) in the library's own cache layout (chapter 4), and packs the tokenised
splits into one gzipped tar (and fits the task's trivial baselines on the same splits, written to
results/baselines/listops-paper.json), _build/gpu_carry/listops-paper.tar.gz (at most `MAX_CARRY_MIB`; its size is printed), the one
folder a device call carries. `train` unpacks it and points the library's cache at it, so that no expression is
generated on the device, and fails if the cache changed (generation happened after all). For
each model it first measures its training throughput in a short probe (`probe`: full-length batches, after
compilation), then trains the `paper` preset's model (D = 128, 4 blocks) for as many whole epochs over the
prepared training split as fit the training budget at `SAFETY` times the slowest model's throughput (the same
epochs for every model, at most the preset's 10, at least one), and scores the best epoch (validation loss) on all
10,000 test expressions, with predictions saved. One seed under a time budget decides nothing: the results chapter
shows these records as such, beside the task's trivial baselines. The step stops a run cleanly at `--budget` x 1.25
seconds should the probe have been too optimistic; such a run is recorded as incomplete, with no accuracy.

Budget per model: the probe (under a minute, most of it compilation) + `--budget` (default 150 s) of training +
the test pass: under 4 minutes on one H100-class GPU. Both models: under 8 minutes, inside one device call.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # this checkout's hkt_nb, not another installed copy
    sys.path.insert(0, str(ROOT))

MAX_CARRY_MIB = 60  # the prepared data must fit what a device call carries
SAFETY = 0.8  # the plan assumes 80 % of the probe's throughput (data loading, validation, the test pass)
FULL = {"n_train": 96_000, "n_val": 2_000, "n_test": 10_000}  # the ListOps "paper" setting (chapter 4a)
TOY = {"n_train": 128, "n_val": 64, "n_test": 128}  # the dry run's
TOY_MODEL = dict(d_model=16, n_heads=2, n_layers=1)  # the dry run's model (the probe and the plan are the same)


def folder_bytes(folder: Path) -> int:
    "Total size in bytes of the files under `folder`."
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def cache_listing(folder: Path) -> dict:
    "{relative path: size} of every file under `folder`: what `train` checks did not change."
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}


def spec_overrides(sizes: dict) -> dict:
    "The `TrainConfig` overrides that select the prepared splits (the data cache's key depends on them)."
    return dict(sizes)


def prepare(archive: Path, sizes: dict) -> dict:
    """Generate and tokenise the splits (the library's cache layout, in a folder beside `archive`), and pack the
    tokenised splits with `prepared.json` into the gzipped tar `archive`, all a device needs (the raw expressions stay
    here). ValueError when the archive is over MAX_CARRY_MIB."""
    cache = archive.with_suffix("").with_suffix("")  # _build/gpu_carry/listops-paper.tar.gz -> .../listops-paper
    os.environ["HKT_CACHE_DIR"] = str(cache)
    from hkt_nb.lra.config import RunSpec

    started = time.time()
    spec = RunSpec("listops", "hkt", "paper", 0, train_overrides=spec_overrides(sizes))
    splits, vocab_size, n_classes = spec.load_splits(None)
    info = {"sizes": {s: len(d) for s, d in splits.items()}, "vocab_size": vocab_size, "n_classes": n_classes,
            "requested": sizes, "tokenized_bytes": folder_bytes(cache / "tokenized")}
    if not is_toy(sizes):  # the task's trivial baselines on the same splits, fit here on the CPU (chapter 4d)
        info["baselines"] = fit_paper_baselines(splits)
    (cache / "prepared.json").write_text(json.dumps(info, indent=1) + "\n")
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(cache / "tokenized", arcname="tokenized")
        tar.add(cache / "prepared.json", arcname="prepared.json")
    size = archive.stat().st_size
    print(f"[gpu-results] prepared {info['sizes']} in {archive} ({size / 2**20:.1f} MiB packed, "
          f"{info['tokenized_bytes'] / 2**20:.1f} MiB unpacked, {time.time() - started:.0f} s)", flush=True)
    if size > MAX_CARRY_MIB * 2**20:
        raise ValueError(f"{archive} takes {size / 2**20:.1f} MiB, more than the {MAX_CARRY_MIB} MiB a device call "
                         f"carries: prepare fewer training examples (--n-train)")
    return info


def is_toy(sizes: dict) -> bool:
    "Whether `sizes` are a dry run's (no baselines are fit or written for those)."
    return sizes["n_train"] < FULL["n_train"] // 10


def fit_paper_baselines(splits: dict) -> dict:
    """The trivial baselines of ListOps (chapter 4d) fit on the prepared splits, which are the `paper` preset's
    (the same generator streams, sizes and data seed), written to results/baselines/listops-paper.json with their
    test predictions: the bar the results chapter sets beside the GPU runs. Returns {name: test accuracy}."""
    from hkt_nb.lra.baselines import fit_baselines, save_baselines, split_sequences

    result = fit_baselines("listops", "paper", splits={s: split_sequences(d) for s, d in splits.items()})
    save_baselines(result, ROOT / "results")
    return {name: b["test_acc"] for name, b in result["baselines"].items()}


def unpack(archive: Path) -> Path:
    "The folder the prepared `archive` unpacks to (beside it, `<name>-unpacked`), unpacked afresh."
    if not archive.is_file():
        raise SystemExit(f"no prepared data {archive}: run `python scripts/gpu_results.py prepare` on the CPU first "
                         "and carry that folder to the device")
    folder = archive.parent / (archive.name.split(".")[0] + "-unpacked")
    shutil.rmtree(folder, ignore_errors=True)
    with tarfile.open(archive, "r:gz") as tar:
        tar.extractall(folder, filter="data")
    return folder


def plan_epochs(examples_per_s: float, budget_s: float, n_train: int, max_epochs: int) -> dict:
    """The run that fits `budget_s` seconds of training at `examples_per_s`: the most whole epochs over the `n_train`
    prepared examples that fit, at most `max_epochs`; one epoch when not even one fits (the run's time budget may
    then stop it, and it is recorded as incomplete: another training size would need data made on the device).
    `fits` says whether the plan fits. Known answers in tests/test_tasks.py."""
    if not (examples_per_s > 0 and budget_s > 0 and n_train > 0 and max_epochs > 0):
        raise ValueError(f"need a positive throughput, budget, training size and epoch cap, got {examples_per_s} "
                         f"examples/s, {budget_s} s, {n_train} examples, {max_epochs} epochs")
    epochs = min(max_epochs, math.floor(examples_per_s * budget_s / n_train))
    return {"epochs": max(1, epochs), "fits": epochs >= 1}


def _train(model: str, overrides: dict, out: Path, device: str, budget_s: float | None, model_overrides: dict,
           checkpoints: Path) -> dict:
    """One run: its record and test predictions in `out` (five files for two models, with summary.json: what a
    device call brings back), its per-epoch checkpoints in `checkpoints` (they stay on the device), no saved model."""
    from hkt_nb.lra.loop import train

    return train("listops", model, "paper", 0, device=device, results_dir=out, resume=False, progress=False,
                 checkpoint_dir=checkpoints / model, time_budget_s=budget_s,
                 train_overrides={**overrides, "save_model": False}, model_overrides=model_overrides or None)


def probe(model: str, device: str, model_overrides: dict, vocab_size: int, n_classes: int,
          warmup_steps: int = 10, steps: int = 40) -> float:
    """Training examples per second of `model` on full-length batches (the preset's batch of T = 512 tokens), timed
    over `steps` optimiser steps after `warmup_steps` (compilation) on random tokens: the arithmetic of a training
    step, without the data pipeline (the plan keeps a margin for it, `SAFETY`)."""
    import torch
    import torch.nn.functional as F

    from hkt_nb.lra.config import build_config, get_preset
    from hkt_nb.train.distributed import amp_dtype, wrap
    from hkt_nb.train.optim import param_groups
    from hkt_nb.model import HKTClassifier

    train_config = get_preset("paper").train_config("listops")
    config = build_config("listops", model, get_preset("paper"), vocab_size, n_classes, 512, **model_overrides)
    dev = torch.device(device)
    net = HKTClassifier(config).to(dev)
    network, dtype = wrap(net, train_config, dev, 1), amp_dtype(dev, train_config.amp)
    optimizer = torch.optim.AdamW(param_groups(net, train_config.weight_decay), lr=train_config.lr)
    batch = train_config.batch_size
    tokens = torch.randint(1, vocab_size, (batch, 512), device=dev)
    labels = torch.randint(0, n_classes, (batch,), device=dev)

    def step():
        with torch.autocast(dev.type, dtype=dtype, enabled=dtype is not None):
            loss = F.cross_entropy(network(tokens, None).float(), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for _ in range(warmup_steps):
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return steps * batch / (time.perf_counter() - started)


def run_model(model: str, args, sizes: dict, model_overrides: dict, plan: dict, checkpoints: Path) -> dict:
    "Train one model for the planned epochs; its summary (the record's name, accuracy, or why there is none)."
    started = time.time()
    record = _train(model, {**sizes, "epochs": plan["epochs"]}, args.out, args.device, 1.25 * args.budget,
                    model_overrides, checkpoints)
    summary = {"model": model, "run": record["run"], "complete": record["complete"], "wall_s": round(time.time() - started, 1),
               "test_acc": record.get("test_acc"), "n_test": record.get("n_test_evaluated")}
    print(f"[gpu-results] {model}: {json.dumps(summary)}", flush=True)
    return summary


def train_all(args, sizes: dict, model_overrides: dict) -> int:
    """Probe every model, plan one number of epochs for all (the slowest model's, so that the models are trained
    alike and can be compared on the same test examples), train them; fails (exit 1) if the data cache changed or a
    run is incomplete."""
    from hkt_nb.lra.config import get_preset

    data = unpack(args.data.resolve())
    os.environ["HKT_CACHE_DIR"] = str(data)
    before = cache_listing(data)
    prepared = json.loads((data / "prepared.json").read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    rates = {m: probe(m, args.device, model_overrides, prepared["vocab_size"], prepared["n_classes"], *args.probe_steps)
             for m in args.models}
    plan = plan_epochs(SAFETY * min(rates.values()), args.budget, sizes["n_train"], get_preset("paper").train.epochs)
    print(f"[gpu-results] probe (examples/s): {', '.join(f'{m} {r:.0f}' for m, r in rates.items())} -> "
          f"{plan['epochs']} epochs of {sizes['n_train']:,} examples for every model in a {args.budget:g} s budget"
          f"{'' if plan['fits'] else ' (does not fit)'}", flush=True)
    summaries = [run_model(m, args, sizes, model_overrides, plan, data.parent / "checkpoints") for m in args.models]
    generated = sorted(set(cache_listing(data)) - set(before))
    summary = {"dry_run": args.dry_run, "device": args.device, "prepared": prepared, "budget_s": args.budget,
               "probe_examples_per_s": rates, "safety": SAFETY, "plan": plan, "runs": summaries,
               "generated_on_device": generated, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    if generated:
        print(f"[gpu-results] FAILED: data were generated on the device ({generated[:3]} ...)", flush=True)
    incomplete = [s["model"] for s in summaries if not s["complete"]]
    if incomplete:
        print(f"[gpu-results] incomplete (budget exceeded): {incomplete}", flush=True)
    return 1 if generated or incomplete else 0


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=("prepare", "train", "dry-run"))
    p.add_argument("--data", type=Path, default=None, help="the prepared data (default _build/gpu_carry/listops-paper.tar.gz)")
    p.add_argument("--out", type=Path, default=None, help="where records go (default results/gpu/accuracy)")
    p.add_argument("--budget", type=float, default=None, help="seconds of training per model (default 150; dry 20)")
    p.add_argument("--models", nargs="*", default=["hkt", "mha"])
    p.add_argument("--n-train", type=int, default=None, help="training expressions to prepare (default 96,000)")
    p.add_argument("--device", default=None, help="default cuda (dry run: cpu)")
    a = p.parse_args(argv)
    a.dry_run = a.action == "dry-run"
    build = ROOT / "_build" / ("gpu_check_dry" if a.dry_run else "")
    a.data = a.data or build / "gpu_carry" / "listops-paper.tar.gz"
    a.out = a.out or (build / "accuracy" if a.dry_run else ROOT / "results" / "gpu" / "accuracy")
    a.budget = a.budget if a.budget is not None else (20.0 if a.dry_run else 150.0)
    a.device = a.device or ("cpu" if a.dry_run else "cuda")
    a.probe_steps = (2, 4) if a.dry_run else (10, 40)  # (warm-up, timed) optimiser steps of `probe`
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    sizes = dict(TOY if a.dry_run else FULL)
    if a.n_train is not None:
        sizes["n_train"] = a.n_train
    if a.action in ("prepare", "dry-run"):
        a.data.parent.mkdir(parents=True, exist_ok=True)
        prepare(a.data, sizes)
    if a.action == "prepare":
        return 0
    if a.device.startswith("cuda"):
        import torch
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA GPU here: `python scripts/gpu_results.py dry-run` runs the same path on the CPU")
    return train_all(a, sizes, TOY_MODEL if a.dry_run else {})


if __name__ == "__main__":
    sys.exit(main())
