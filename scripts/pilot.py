"""The pilot of chapter 5: learning curves of HKT and standard attention under candidate `cpu` settings.

    python scripts/pilot.py [--only NAME ...] [--dry-run]

Each candidate is one (task, data setting, training length) and is trained for both models on seed 0 with the
`cpu` preset's model and optimiser, with validation loss and accuracy after every epoch (the learning curve).
Records go to `results/pilot/<candidate>-<model>.json` (the loop's record plus the candidate's settings); a
finished candidate is skipped, an interrupted one resumes from its last epoch checkpoint. One thread per process.
`--baselines` fits the task's trivial baselines on each candidate's own splits (`baselines-<candidate>.json`).

The rule that turns the pilot into the `cpu` preset (chapter 5, *The pilot*): per task, the cheapest candidate
(training time of both models) in which both models' best validation accuracy exceeds the strongest trivial
baseline's validation accuracy by at least MARGIN; a task with no such candidate is excluded from the verdicts.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: name -> (task, load_benchmark options, seq_len, TrainConfig overrides). In priority order.
CANDIDATES = {
    "listops-short-100k": ("listops", {"setting": "short"}, 128, dict(n_train=20_000, epochs=5)),
    "listops-short-200k": ("listops", {"setting": "short"}, 128, dict(n_train=40_000, epochs=5)),
    "listops-paper-48k": ("listops", {"setting": "paper"}, 512, dict(n_train=16_000, epochs=3)),
    "scifar10-20k": ("scifar10", {}, 1024, dict(n_train=10_000, epochs=2)),
    "imdb-20k": ("imdb", {}, 1024, dict(n_train=10_000, epochs=2)),
}
MODELS = ("hkt", "mha")
MARGIN = 0.05  # accuracy points (as a fraction) above the strongest baseline on validation, for both models
N_VAL, N_TEST = 1000, 1000  # the pilot chooses on validation; its test scores are not used


def pilot_path(results: Path, candidate: str, model: str) -> Path:
    return results / f"{candidate}-{model}.json"


def run(candidate: str, model: str, results: Path) -> dict:
    import torch
    from hkt_nb.lra.benchmarks import load_benchmark
    from hkt_nb.lra.loop import train

    task, options, seq_len, overrides = CANDIDATES[candidate]
    torch.set_num_threads(1)
    caps = {"train": overrides["n_train"], "validation": N_VAL, "test": N_TEST}
    data = load_benchmark(task, seq_len=seq_len, max_examples=caps, seed=0, **options)
    record = train(task, model, "cpu", 0, dataset=data, model_overrides={"max_len": seq_len},
                   train_overrides={**overrides, "n_val": N_VAL, "n_test": N_TEST, "save_model": False},
                   results_dir=results / "runs", progress=False)
    record = {**record, "pilot": {"candidate": candidate, "task": task, "options": options, "seq_len": seq_len,
                                  "overrides": overrides}}
    pilot_path(results, candidate, model).write_text(json.dumps(record, indent=1, default=str))
    return record


def baselines(candidate: str, results: Path) -> dict:
    """The task's trivial baselines (chapter 4d) fit on the candidate's own training split, chosen on its validation
    split: `results/pilot/baselines-<candidate>.json` (accuracies only; the pilot decides on validation)."""
    from hkt_nb.lra.baselines import fit_baselines, split_sequences
    from hkt_nb.lra.benchmarks import load_benchmark

    task, options, seq_len, overrides = CANDIDATES[candidate]
    caps = {"train": overrides["n_train"], "validation": N_VAL, "test": N_TEST}
    data = load_benchmark(task, seq_len=seq_len, max_examples=caps, seed=0, **options)
    fit = fit_baselines(task, "cpu", splits={s: split_sequences(data[s]) for s in ("train", "validation", "test")})
    body = {"candidate": candidate, "strongest": fit["strongest"], "sizes": fit["sizes"],
            "baselines": {name: {k: v for k, v in b.items() if k in ("val_acc", "test_acc", "hyper", "fit_time_s")}
                          for name, b in fit["baselines"].items()}}
    baselines_path(results, candidate).write_text(json.dumps(body, indent=1, default=str) + "\n")
    return body


def baselines_path(results: Path, candidate: str) -> Path:
    return results / f"baselines-{candidate}.json"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="*", default=None)
    p.add_argument("--models", nargs="*", default=list(MODELS))
    p.add_argument("--results-dir", default=str(ROOT / "results" / "pilot"))
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--baselines", action="store_true", help="fit the trivial baselines of the candidates instead")
    a = p.parse_args()
    results = Path(a.results_dir)
    results.mkdir(parents=True, exist_ok=True)
    if a.baselines:
        for c in a.only or CANDIDATES:
            if not baselines_path(results, c).is_file():
                print(c, baselines(c, results)["baselines"], flush=True)
        return
    todo = [(c, m) for c in (a.only or CANDIDATES) for m in a.models if not pilot_path(results, c, m).is_file()]
    print("pilot runs to do:", ", ".join(f"{c}-{m}" for c, m in todo) or "none", flush=True)
    if a.dry_run:
        return
    for c, m in todo:
        r = run(c, m, results)
        print(f"finished {c}-{m}: " + ", ".join(f"{h['val_acc']:.3f}" for h in r["history"]), flush=True)


if __name__ == "__main__":
    main()
