"""Run the book's training runs in order of information per hour, skipping those already finished.

    python scripts/run_experiments.py [--preset cpu] [--jobs 2] [--threads 1] [--only listops] [--stop-at 21:20]
                                      [--models hkt mha] [--seeds 3 4 5 6 7 8 9] [--dry-run]

Each run is one `hkt-train` process (resumable: it checkpoints every epoch, so a stopped queue loses at most
the epoch in progress). `--jobs` processes run at once, each with `--threads` torch threads; on a 2-core
machine two single-thread processes train more examples per second than one two-thread process (see
`results/bench_threads_cpu.json`). Logs go to `<results>/logs/<run>.log` (not committed).
On the `cpu` preset a task whose pilot (chapter 5g) has not decided gets only its seed-0 runs, which are the pilot
runs of its grid candidate; run the queue again once they have finished. A task the pilot excluded (every
candidate failed) is run last: its runs are kept for the record, but no verdict depends on them.
`--stop-at HH:MM` (UTC, today or, if past, tomorrow) starts no run whose estimated training time (chapter 5f's
`estimate_seconds`, times `SAFETY`) would end after it: a run of one long epoch that a stopped session would cut
short loses that epoch, so it waits for the next queue instead.
`--models` keeps only those models of each task, and `--seeds` trains those seeds instead of the preset's (e.g. the
fresh seeds 3-9 of the results chapter's seed-level rule, rule 7, on the `cpu` preset as it is).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # this checkout's hkt_nb, not another installed copy
    sys.path.insert(0, str(ROOT))


def plan() -> list[tuple[str, str]]:
    """(task, model) in priority order, from the task registry (`hkt_nb.lra.tasks.experiment_plan`): the benchmarks in
    registration order (ListOps with its hierarchy ablation first, then sCIFAR-10, then IMDB), each with its models."""
    from hkt_nb.lra.tasks import experiment_plan

    return experiment_plan()


SAFETY = 1.3  # the estimate is rough (a busy machine, T scaled linearly): a run starts only if 1.3x it fits


def fits_before(deadline: float | None,  # epoch seconds, or None: no deadline
                estimate_s: float | None,  # the run's estimated training time, or None when no record gives one
                now: float) -> bool:
    "Whether a run may start: no deadline, or an estimate whose `SAFETY` multiple ends before it (no estimate: no)."
    if deadline is None:
        return True
    return estimate_s is not None and now + SAFETY * estimate_s <= deadline


def parse_stop_at(text: str | None, now: float) -> float | None:
    "`HH:MM` (UTC) as epoch seconds: today's, or tomorrow's when today's has passed; None for None."
    if text is None:
        return None
    import datetime as dt

    hours, minutes = (int(x) for x in text.split(":"))
    today = dt.datetime.fromtimestamp(now, dt.timezone.utc).replace(hour=hours, minute=minutes, second=0, microsecond=0)
    stamp = today.timestamp()
    return stamp if stamp > now else stamp + 86400


def plan_tasks() -> list[str]:
    "The tasks of `plan()`, in order."
    return list(dict.fromkeys(task for task, _ in plan()))


def undecided(preset: str, results_dir: Path) -> set[str]:
    """The tasks whose pilot has not decided (chapter 5g, `pilot_decision`) when `preset` is `cpu`, the preset the pilot
    sizes; no task for any other preset. Their grid waits: only their seed-0 runs (the pilot runs of a grid
    candidate) are queued until the pilot decides, and a later call of the queue picks up the other seeds."""
    if preset != "cpu":
        return set()
    from hkt_nb.lra.pilot import load_pilot, pilot_decision

    return {task for task, d in pilot_decision(*load_pilot(results_dir)).items() if not d["decided"]}


def excluded(preset: str, results_dir: Path) -> set[str]:
    """The tasks the pilot excludes from the verdicts at `preset` (chapter 9, `pilot_exclusions`: at `cpu`, every
    candidate setting failed). Their runs are kept for the record but decide nothing, so they go last."""
    from hkt_nb.lra.results import pilot_exclusions

    return set(pilot_exclusions(results_dir, preset))


def queue(preset: str, only: set[str] | None, results_dir: Path, models: set[str] | None = None,
          seeds: list[int] | None = None) -> list[tuple[str, str, int]]:
    """The runs still to do: every (task, model, seed) of `plan()` (only `models`, when given) and the preset's seeds
    (or `seeds`) without a finished record;
    for a task whose pilot has not decided (`undecided`), seed 0 only; the runs of a task the pilot excluded
    (`excluded`) after every other task's."""
    from hkt_nb.lra.config import get_preset
    from hkt_nb.lra.runs import finished_run
    from hkt_nb.lra.tasks import get_task
    runs = plan()
    for task in only or ():
        get_task(task)  # KeyError listing the registered tasks
    waiting = undecided(preset, results_dir)
    todo = []
    for seed in seeds if seeds is not None else get_preset(preset).seeds:  # seed-major: 3 seeds of a pair beat 6 of one
        for task, model in runs:
            if (only and task not in only) or (models and model not in models):
                continue
            if task in waiting and seed != 0:
                continue
            if finished_run(task, model, preset, seed, results_dir) is None:
                todo.append((task, model, seed))
    order = {t: i for i, t in enumerate(dict.fromkeys(t for t, _ in runs))}
    last = excluded(preset, results_dir)
    return sorted(todo, key=lambda r: (r[0] in last, order[r[0]]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="cpu")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--only", nargs="*", default=None, help="tasks to run (default: all)")
    p.add_argument("--results-dir", default="results")
    p.add_argument("--stop-at", default=None, help="HH:MM UTC: start no run estimated to end after it")
    p.add_argument("--models", nargs="*", default=None, help="models to run (default: each task's own)")
    p.add_argument("--seeds", nargs="*", type=int, default=None, help="seeds to run (default: the preset's)")
    p.add_argument("--dry-run", action="store_true", help="print the queue and exit")
    a = p.parse_args()
    deadline = parse_stop_at(a.stop_at, time.time())
    results_dir = Path(a.results_dir)
    todo = queue(a.preset, set(a.only) if a.only else None, results_dir, set(a.models) if a.models else None, a.seeds)
    from hkt_nb.lra.config import run_name
    from hkt_nb.lra.runs import estimate_seconds
    waiting = undecided(a.preset, results_dir) & (set(a.only) if a.only else set(plan_tasks()))
    if waiting:
        print("waiting for the pilot (seed 0 only): " + ", ".join(sorted(waiting)), flush=True)
    print(f"{len(todo)} runs to do: " + ", ".join(f"{t}-{m}-seed{s}" for t, m, s in todo), flush=True)
    if a.dry_run:
        return
    (results_dir / "logs").mkdir(parents=True, exist_ok=True)
    running: list[tuple[subprocess.Popen, str, float]] = []
    while todo or running:
        while todo and len(running) < a.jobs:
            task, model, seed = todo.pop(0)
            name = run_name(task, model, a.preset, seed)
            estimate = estimate_seconds(task, model, a.preset, results_dir) if deadline is not None else None
            if not fits_before(deadline, estimate, time.time()):
                why = ("no finished CPU record of this task and model to estimate its time from" if estimate is None
                       else f"estimated {estimate / 60:.0f} min of training (x{SAFETY}; evaluation not counted)")
                print(f"not started {name}: {why}; it could end after --stop-at {a.stop_at}", flush=True)
                continue
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
