#!/usr/bin/env python
"""Benchmark: forward + backward time and memory of HKT (explicit and fused forms) against standard
multi-head attention through `scaled_dot_product_attention` (hkt_nb.attention.MultiHeadAttention).

Two sweeps, each measured in ONE process with the three methods interleaved per point (so that their ratios
share the machine's state): sequence length T (default 256..8192 at L = 3) and number of levels L (default
1..5 at T = 2048). Writes a JSON file (default results/bench_cost_<device>.json) and a text copy of the printed
tables beside it (.txt). Run from the repository root:

    python scripts/bench_cost.py                  # CPU defaults, a few minutes on 2 cores
    python scripts/bench_cost.py --device cuda    # GPU

Memory is reported two ways:
  saved_bytes  bytes of the tensors autograd saves for backward (distinct storages, counted exactly with
               torch.autograd.graph.saved_tensors_hooks): the activation memory of a training step;
               deterministic and device-independent.
  peak_bytes   CUDA: torch.cuda.max_memory_allocated increase during the step (exact for the allocator).
               CPU: increase of the process's resident set size during the step, sampled every ~1 ms by a
               thread (approximate: glibc may keep freed memory, and short-lived peaks can be missed).
The explicit form is skipped ("skipped (memory)") where its saved bytes, predicted by a run on the meta
device (no memory allocated), exceed --mem-cap-gb.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from hkt_nb.attention import HierarchicalAttention, MultiHeadAttention  # noqa: E402
from hkt_nb.cost import hkt_flops, mha_flops, saved_tensor_bytes, score_cost_ratio  # noqa: E402

MALLOC_VARS = ("MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
               "MALLOC_MMAP_MAX_", "GLIBC_TUNABLES", "LD_PRELOAD", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def allocator_info(device: str) -> dict:
    env = {k: os.environ[k] for k in MALLOC_VARS if k in os.environ}
    info = {"env": env}
    if device == "cpu":
        tuned = any(k.startswith("MALLOC") or k in ("GLIBC_TUNABLES", "LD_PRELOAD") for k in env)
        info["summary"] = ("glibc malloc with the settings in env" if tuned else
                           "glibc malloc, default settings (no MALLOC_* / GLIBC_TUNABLES / LD_PRELOAD set): large "
                           "T x T tensors are mmap-ed and returned on free, so the explicit form pays page faults on "
                           "every step; e.g. MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=4294967296 "
                           "reduces them (at the cost of keeping memory)")
    else:
        info["summary"] = "PyTorch CUDA caching allocator, PYTORCH_CUDA_ALLOC_CONF=" + os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "(unset)")
    return info


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    "Context manager: peak increase of the resident set size, sampled by a background thread."

    def __enter__(self):
        self.base = self.peak = rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            time.sleep(0.001)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())
        self.delta = self.peak - self.base


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build(method: str, args, L: int, device, dtype):
    torch.manual_seed(0)
    if method == "mha":
        return MultiHeadAttention(args.d_model, args.heads).to(device, dtype), "fused"
    return HierarchicalAttention(args.d_model, args.heads, L, args.stride).to(device, dtype), method.split("_")[1]


def step(module, x, impl):
    module.zero_grad(set_to_none=True)
    x.grad = None
    module(x, impl=impl).sum().backward()


def predicted_saved_bytes(args, T, L, dtype) -> int:
    "Saved-for-backward bytes of the explicit form, from a run on the meta device (nothing allocated)."
    meta = torch.device("meta")
    module = HierarchicalAttention(args.d_model, args.heads, L, args.stride).to(meta, dtype)
    x = torch.empty(args.batch, T, args.d_model, device=meta, dtype=dtype, requires_grad=True)
    return saved_tensor_bytes(module, x, impl="explicit")[1]


def measure_point(args, T, L, device, dtype, log) -> list[dict]:
    methods = ["mha", "hkt_fused", "hkt_explicit"]
    rows, modules = {}, {}
    x = torch.randn(args.batch, T, args.d_model, device=device, dtype=dtype, requires_grad=True)
    for m in methods:
        row = {"T": T, "L": L, "method": m, "time_ms": None, "times_ms": [], "saved_bytes": None,
               "peak_bytes": None, "ratio": None, "status": "ok"}
        if m == "hkt_explicit":
            pred = predicted_saved_bytes(args, T, L, dtype)
            row["predicted_saved_bytes"] = pred
            if pred > args.mem_cap_gb * 2**30:
                row["status"] = f"skipped (memory): predicted saved bytes {pred / 2**30:.1f} GiB > cap {args.mem_cap_gb} GiB"
        rows[m] = row
        if row["status"] == "ok":
            modules[m] = build(m, args, L, device, dtype)
    # memory (one step each), then warm-up
    for m, (module, impl) in modules.items():
        module.zero_grad(set_to_none=True)
        _, rows[m]["saved_bytes"] = saved_tensor_bytes(lambda: module(x, impl=impl).sum())
        del _
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
            step(module, x, impl)
            sync(device)
            rows[m]["peak_bytes"] = torch.cuda.max_memory_allocated(device) - base
        else:
            with PeakRSS() as p:
                step(module, x, impl)
            rows[m]["peak_bytes"] = p.delta
        for _ in range(args.warmup):
            step(module, x, impl)
    # timing: interleaved rounds, at least `repeats` of them and until each method has run `min_time` s (max 25)
    rounds = 0
    while modules and (rounds < args.repeats or
                       (min(sum(rows[m]["times_ms"]) for m in modules) < 1e3 * args.min_time and rounds < 25)):
        rounds += 1
        for m, (module, impl) in modules.items():
            sync(device)
            t0 = time.perf_counter()
            step(module, x, impl)
            sync(device)
            rows[m]["times_ms"].append(1e3 * (time.perf_counter() - t0))
    for m in methods:
        if rows[m]["times_ms"]:
            rows[m]["time_ms"] = statistics.median(rows[m]["times_ms"])
    base = rows["mha"]["time_ms"]
    for m in methods:
        r = rows[m]
        if r["time_ms"] is not None:
            r["ratio"] = r["time_ms"] / base
        impl = "fused" if m != "hkt_explicit" else "explicit"
        f = (mha_flops(args.batch, T, args.d_model, args.heads, backward=True) if m == "mha" else
             hkt_flops(args.batch, T, args.d_model, args.heads, L, args.stride, impl=impl, backward=True))
        r["analytic_flops_fwd_bwd"] = f["total"]
        log(fmt_row(r))
    return [rows[m] for m in methods]


HEADER = f"{'T':>6} {'L':>2} {'method':13} {'time ms':>10} {'x MHA':>7} {'GFLOP':>8} {'saved MiB':>10} {'peak MiB':>9}  status"


def fmt_row(r):
    t = "" if r["time_ms"] is None else f"{r['time_ms']:10.1f}"
    rat = "" if r["ratio"] is None else f"{r['ratio']:7.2f}"
    sv = "" if r["saved_bytes"] is None else f"{r['saved_bytes'] / 2**20:10.1f}"
    pk = "" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**20:9.1f}"
    return (f"{r['T']:6d} {r['L']:2d} {r['method']:13} {t:>10} {rat:>7} {r['analytic_flops_fwd_bwd'] / 1e9:8.2f} "
            f"{sv:>10} {pk:>9}  {r['status']}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", help="cpu or cuda[:i]")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--levels", type=int, default=3, help="L of the length sweep")
    p.add_argument("--stride", type=int, default=2)
    p.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096, 8192])
    p.add_argument("--sweep-length", type=int, default=2048, help="T of the level sweep")
    p.add_argument("--sweep-levels", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--min-time", type=float, default=1.0, help="repeat until each method ran this many seconds (max 25 rounds)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--mem-cap-gb", type=float, default=2.0, help="skip the explicit form above this many GiB saved")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16", "float16"])
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--note", default="", help="free text stored in the output, e.g. what else ran on the machine")
    p.add_argument("--out", default=None, help="output JSON (default results/bench_cost_<device type>.json)")
    args = p.parse_args(argv)

    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda requested but torch.cuda.is_available() is False")
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out) if args.out else ROOT / "results" / f"bench_cost_{device.type}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = []

    def log(s=""):
        print(s, flush=True)
        lines.append(s)

    meta = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "device": str(device) if device.type == "cpu" else f"{device} ({torch.cuda.get_device_name(device)})",
        "cpu": cpu_name(), "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(),
        "torch": torch.__version__, "python": platform.python_version(),
        "allocator": allocator_info(device.type),
        "config": {"batch": args.batch, "d_model": args.d_model, "heads": args.heads, "head_dim": args.d_model // args.heads,
                   "levels": args.levels, "stride": args.stride, "lengths": args.lengths,
                   "sweep_length": args.sweep_length, "sweep_levels": args.sweep_levels, "repeats": args.repeats,
                   "min_time_s": args.min_time, "warmup": args.warmup, "mem_cap_gb": args.mem_cap_gb, "dtype": args.dtype},
        "timing": "median of at least `repeats` forward + backward steps (more, up to 25, until each method ran `min_time_s`) (loss = output.sum()), methods interleaved, after "
                  "`warmup` steps; input requires grad",
        "memory": {"saved_bytes": "bytes of distinct storages saved for backward (torch.autograd.graph.saved_tensors_hooks)",
                   "peak_bytes": ("increase of torch.cuda.max_memory_allocated during one step" if device.type == "cuda" else
                                  "increase of process RSS during one step, sampled every ~1 ms (approximate)")},
        "note": ("The machine may be shared with other jobs: absolute times are noisy; report ratios measured in "
                 "one process. " + args.note).strip(),
        "score_cost_ratio": score_cost_ratio(args.levels, args.stride),
        "loadavg_start": os.getloadavg(),
    }
    log(f"bench_cost: {meta['device']}, cpu {meta['cpu']} ({meta['cpu_count']} logical), torch {meta['torch']}, "
        f"threads {meta['threads']}, dtype {args.dtype}")
    log(f"allocator: {meta['allocator']['summary']}; env {meta['allocator']['env']}")
    log(f"note: {meta['note']} Load average (1, 5, 15 min) at start: {meta['loadavg_start']}")
    log(f"config: {meta['config']}")
    log(f"score_cost_ratio(L={args.levels}, s={args.stride}) = {meta['score_cost_ratio']:.4f} (per-level QK^T FLOPs only)")
    t_start = time.time()
    log("\n## length sweep (L = %d)" % args.levels)
    log(HEADER)
    length_rows = [r for T in args.lengths for r in measure_point(args, T, args.levels, device, dtype, log)]
    log("\n## level sweep (T = %d)" % args.sweep_length)
    log(HEADER)
    level_rows = [r for L in args.sweep_levels for r in measure_point(args, args.sweep_length, L, device, dtype, log)]
    meta["wall_s"] = round(time.time() - t_start, 1)
    meta["loadavg_end"] = os.getloadavg()
    log(f"\ntotal wall time {meta['wall_s']} s; load average at end {meta['loadavg_end']}")
    out.write_text(json.dumps({"meta": meta, "length_sweep": length_rows, "level_sweep": level_rows}, indent=1))
    out.with_suffix(".txt").write_text("\n".join(lines) + "\n")
    print(f"wrote {out} and {out.with_suffix('.txt')}")


if __name__ == "__main__":
    main()
