"""Fit the trivial baselines of every benchmark on a preset's splits and write them under results/baselines/.

    python scripts/run_baselines.py --preset cpu                 # all benchmarks of the task registry
    python scripts/run_baselines.py --preset cpu --tasks listops

Per task: results/baselines/<task>-<preset>.json (validation and test accuracy, test cross-entropy, the chosen
hyper-parameters, the fit's size, library versions) and results/baselines/predictions/<task>-<preset>-<baseline>.npz
(test `predictions` and `labels`, as a run's predictions file). See chapter 4, *Trivial baselines* (nbs/04d_baselines.ipynb).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # this checkout's hkt_nb, not another installed copy
    sys.path.insert(0, str(ROOT))


def main(argv=None) -> None:
    from hkt_nb.lra.baselines import fit_baselines, save_baselines
    from hkt_nb.lra.tasks import BENCHMARKS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cpu")
    parser.add_argument("--tasks", nargs="*", default=list(BENCHMARKS))
    parser.add_argument("--results-dir", default=str(ROOT / "results"))
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for task in args.tasks:
        start = time.perf_counter()
        result = fit_baselines(task, args.preset, seed=args.seed, data_dir=args.data_dir)
        save_baselines(result, args.results_dir)
        scores = ", ".join(f"{name} {100 * r['test_acc']:.1f} %" for name, r in result["baselines"].items())
        print(f"{task}-{args.preset}: {scores} (strongest: {result['strongest']}; "
              f"{time.perf_counter() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
