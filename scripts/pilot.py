"""The pilot of chapter 5: learning curves of HKT and standard attention under candidate `cpu` settings.

    python scripts/pilot.py [--only NAME ...] [--dry-run]

Each candidate is one (task, data setting, training length) and is trained for both models on seed 0 with the
`cpu` preset's model and optimiser (a candidate that is the `cpu` preset's own setting is not: the grid's seed-0
run is its pilot run, `grid_candidate`), with validation loss and accuracy after every epoch (the learning curve).
Records go to `results/pilot/<candidate>-<model>.json` (the loop's record plus the candidate's settings); a
finished candidate is skipped, an interrupted one resumes from its last epoch checkpoint. One thread per process.
`--baselines` fits the task's trivial baselines on each candidate's own splits (`baselines-<candidate>.json`).

The candidates and the rule that turns them into the `cpu` preset are the library's (`hkt_nb.lra.pilot`, chapter
*The pilot*), which also reads and plots what this script writes.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hkt_nb.lra.pilot import PILOT_CANDIDATES as CANDIDATES  # noqa: E402 (the candidates and the rule: chapter 5g)
from hkt_nb.lra.pilot import PILOT_MODELS as MODELS  # noqa: E402
from hkt_nb.lra.pilot import PILOT_N_TEST as N_TEST  # noqa: E402
from hkt_nb.lra.pilot import PILOT_N_VAL as N_VAL  # noqa: E402
from hkt_nb.lra.pilot import grid_candidate  # noqa: E402


def pilot_path(results: Path, candidate: str, model: str) -> Path:
    return results / f"{candidate}-{model}.json"


def run(candidate: str, model: str, results: Path) -> dict:
    import torch

    from hkt_nb.train.checkpoints import atomic_save
    from hkt_nb.lra.loop import train

    task, options, seq_len, overrides = CANDIDATES[candidate]
    torch.set_num_threads(1)
    # a variant of the cpu preset: the candidate's data options (T follows them) and sizes, the pilot's own splits
    record = train(task, model, "cpu", 0, results_dir=results / "runs", progress=False,
                   train_overrides={**overrides, "task_options": options or None, "n_val": N_VAL, "n_test": N_TEST,
                                    "save_model": False})
    assert record["config"]["model"]["max_len"] == seq_len, (candidate, record["config"]["model"]["max_len"])
    record = {**record, "pilot": {"candidate": candidate, "task": task, "options": options, "seq_len": seq_len,
                                  "overrides": overrides}}
    atomic_save(record, pilot_path(results, candidate, model))
    return record


def baselines(candidate: str, results: Path) -> dict:
    """The task's trivial baselines (chapter 4d) fit on the candidate's own training split, chosen on its validation
    split: `results/pilot/baselines-<candidate>.json` (accuracies only; the pilot decides on validation)."""
    from hkt_nb.lra.baselines import fit_baselines, split_sequences
    from hkt_nb.lra.benchmarks import load_task
    from hkt_nb.train.checkpoints import atomic_save

    task, options, _, overrides = CANDIDATES[candidate]
    caps = {"train": overrides["n_train"], "validation": N_VAL, "test": N_TEST}
    data = load_task(task, caps=caps, seed=0, options=options or None)  # the splits `run` trains on
    fit = fit_baselines(task, "cpu", splits={s: split_sequences(data[s]) for s in ("train", "validation", "test")})
    body = {"candidate": candidate, "strongest": fit["strongest"], "sizes": fit["sizes"],
            "baselines": {name: {k: v for k, v in b.items() if k in ("val_acc", "test_acc", "hyper", "fit_time_s")}
                          for name, b in fit["baselines"].items()}}
    atomic_save(body, baselines_path(results, candidate))
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
    chosen = a.only or list(CANDIDATES)
    from_grid = [c for c in chosen if grid_candidate(c) and not pilot_path(results, c, a.models[0]).is_file()]
    if from_grid:  # its pilot run is the `cpu` grid's seed-0 run (`grid_candidate`, chapter 5g): not trained twice
        print("from the cpu grid's seed-0 runs and cpu baselines (scripts/run_experiments.py, scripts/run_baselines.py):",
              ", ".join(from_grid), flush=True)
    chosen = [c for c in chosen if c not in from_grid]
    if a.baselines:
        for c in chosen:
            if not baselines_path(results, c).is_file():
                print(c, baselines(c, results)["baselines"], flush=True)
        return
    todo = [(c, m) for c in chosen for m in a.models if not pilot_path(results, c, m).is_file()]
    print("pilot runs to do:", ", ".join(f"{c}-{m}" for c, m in todo) or "none", flush=True)
    if a.dry_run:
        return
    for c, m in todo:
        r = run(c, m, results)
        print(f"finished {c}-{m}: " + ", ".join(f"{h['val_acc']:.3f}" for h in r["history"]), flush=True)


if __name__ == "__main__":
    main()
