"""Train the language-model chapter's runs of a preset seed by seed, skipping finished ones (chapter 15).

    python scripts/run_lm_grid.py [--preset cpu] [--models mha hkt_l3 ...] [--seeds 0 1 2] [--threads 1]

Seed-major order (every model of seed 0 first), so that an interrupted grid has complete seeds to compare. Each
run writes `results/lm/lm-<model>-<preset>-seed<k>.json` when it finishes; `run_lm` loads a finished run with the
same configuration instead of training it. A run checkpoints every `eval_every` steps
(`results/lm/checkpoints/<run>.pt`): an interrupted one, even by SIGKILL, resumes from its last checkpoint to the
record of an uninterrupted run. A finished run's model is saved in `results/lm/pretrained/<run>/`
(`ByteLM.from_pretrained`). Two queues may share a grid (e.g. one started with `--reverse`): a run being trained
holds the lock file `results/lm/<run>.lock` (`run_lm` takes it with chapter 5's `run_lock`), and the other queue
skips it.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # this checkout's hkt_nb, not another installed copy
    sys.path.insert(0, str(ROOT))

ORDER = ("mha", "hkt_l3", "hkt_l1", "mha_window", "hkt_l2")  # the main comparison first, then the ablations


def main() -> None:
    import torch

    from hkt_nb.lm import LM_PRESETS, lm_run_name, run_lm
    from hkt_nb.train.checkpoints import RunLockedError

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="cpu")
    p.add_argument("--models", nargs="*", default=list(ORDER))
    p.add_argument("--seeds", nargs="*", type=int, default=None, help="default: the preset's")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reverse", action="store_true", help="take the runs in the opposite order (a second queue)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    seeds = a.seeds if a.seeds is not None else LM_PRESETS[a.preset].seeds
    todo = [(seed, model) for seed in seeds for model in a.models]
    for seed, model in reversed(todo) if a.reverse else todo:
        name = lm_run_name(model, a.preset, seed)
        try:
            run_lm([model], a.preset, [seed], log=lambda line: print(line, flush=True))
        except RunLockedError as error:
            print(f"skipped {name}: {error}", flush=True)
            continue
        print(f"done {name}", flush=True)


if __name__ == "__main__":
    main()
