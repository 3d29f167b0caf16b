"""Run the book's training runs in order of information per hour, skipping those already finished.

    python scripts/run_experiments.py [--preset cpu] [--jobs 2] [--threads 1] [--only listops] [--dry-run]

Each run is one `hkt-train` process (resumable: it checkpoints every epoch, so a stopped queue loses at most
the epoch in progress). `--jobs` processes run at once, each with `--threads` torch threads; on a 2-core
machine two single-thread processes train more examples per second than one two-thread process (see
`results/bench_threads_cpu.json`). Logs go to `<results>/logs/<run>.log` (not committed).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

SEEDS = (0, 1, 2)
# (task, model) in priority order: ListOps seeds and the hierarchy ablation first, then sCIFAR-10, then IMDB
PLAN = [("listops", m) for m in ("hkt", "mha", "hkt_l1", "hkt_l2")] + \
       [("scifar10", m) for m in ("hkt", "mha")] + [("imdb", m) for m in ("hkt", "mha")]


def queue(preset: str, only: set[str] | None, results_dir: Path) -> list[tuple[str, str, int]]:
    "The runs still to do: every (task, model, seed) of PLAN without a finished results JSON, ListOps first."
    from hkt_nb.lra.runs import finished_run
    todo = []
    for seed in SEEDS:                      # seed-major inside a task: three seeds of a pair beat six of one
        for task, model in PLAN:
            if only and task not in only:
                continue
            if finished_run(task, model, preset, seed, results_dir) is None:
                todo.append((task, model, seed))
    order = {t: i for i, t in enumerate(dict.fromkeys(t for t, _ in PLAN))}
    return sorted(todo, key=lambda r: order[r[0]])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="cpu")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--only", nargs="*", default=None, help="tasks to run (default: all)")
    p.add_argument("--results-dir", default="results")
    p.add_argument("--dry-run", action="store_true", help="print the queue and exit")
    a = p.parse_args()
    results_dir = Path(a.results_dir)
    todo = queue(a.preset, set(a.only) if a.only else None, results_dir)
    print(f"{len(todo)} runs to do: " + ", ".join(f"{t}-{m}-seed{s}" for t, m, s in todo), flush=True)
    if a.dry_run:
        return
    (results_dir / "logs").mkdir(parents=True, exist_ok=True)
    running: list[tuple[subprocess.Popen, str, float]] = []
    while todo or running:
        while todo and len(running) < a.jobs:
            task, model, seed = todo.pop(0)
            name = f"{task}-{model}-{a.preset}-seed{seed}"
            cmd = [sys.executable, "-m", "hkt_nb.lra.runs", "--task", task, "--model", model, "--preset", a.preset,
                   "--seed", str(seed), "--device", "cpu", "--threads", str(a.threads), "--no-progress",
                   "--results-dir", str(results_dir)]
            log = open(results_dir / "logs" / f"{name}.log", "a")
            env = {**os.environ, "OMP_NUM_THREADS": str(a.threads)}
            running.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), name, time.time()))
            print(f"started {name}", flush=True)
        time.sleep(5)
        for proc, name, t0 in list(running):
            if proc.poll() is not None:
                running.remove((proc, name, t0))
                print(f"finished {name}: exit {proc.returncode} after {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
