"""Which uses a 2-core CPU better for training: one process with 2 torch threads, or 2 single-thread processes?

    python scripts/bench_threads.py [--steps 8] [--out results/bench_threads_cpu.json]

Times training steps of the `cpu`-preset ListOps models (HKT and its parameter-matched MHA; batch 32, T = 384,
random tokens) in both arrangements, run one after the other on an otherwise idle machine, and records the total
examples per second of each. The run queue (`scripts/run_experiments.py`) uses the faster arrangement.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import time


def steps_per_s(model: str, threads: int, steps: int, queue) -> None:
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(threads)
    from hkt_nb.lra.config import build_config, get_preset
    from hkt_nb.model import HKTClassifier
    cfg = build_config("listops", model, get_preset("cpu"), 16, 10)
    net = HKTClassifier(cfg)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(1, 16, (32, 384), generator=g), torch.randint(0, 10, (32,), generator=g)
    def step():
        loss = F.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    for _ in range(2):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    queue.put(32 * steps / (time.perf_counter() - t0))


def measure(model: str, n_procs: int, threads: int, steps: int) -> float:
    "Total training examples per second of `n_procs` processes with `threads` threads each, run together."
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=steps_per_s, args=(model, threads, steps, queue)) for _ in range(n_procs)]
    for p in procs:
        p.start()
    rates = [queue.get() for _ in procs]
    for p in procs:
        p.join()
    return sum(rates)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--out", default="results/bench_threads_cpu.json")
    a = p.parse_args()
    out = {"what": "total training examples/s, cpu-preset ListOps models, batch 32, T = 384",
           "cpu_count": os.cpu_count(), "platform": platform.platform(), "steps": a.steps, "results": {}}
    for model in ("hkt", "mha"):
        one = measure(model, 1, 2, a.steps)
        two = measure(model, 2, 1, a.steps)
        out["results"][model] = {"1 process x 2 threads": one, "2 processes x 1 thread": two, "ratio": two / one}
        print(f"{model}: 1 x 2 threads {one:.1f} ex/s, 2 x 1 thread {two:.1f} ex/s (x{two / one:.2f})", flush=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
