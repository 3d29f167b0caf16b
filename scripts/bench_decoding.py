#!/usr/bin/env python
"""Benchmark: per-token decoding time of one causal attention layer, with and without a cache (hkt_nb.decoding).

For each context length T (default 256..4096) and each layer, HKT (`HierarchicalAttention(causal=True)`) and
standard attention (`MultiHeadAttention(causal=True)`), all in ONE process on one thread:
  cached    `prefill` the T - 1 first positions, then time `step` on the next tokens (the cache grows by one
            position per step: context length T, T + 1, ...);
  uncached  time the full causal forward on the T-position prefix, the work a decoder without a cache repeats
            for every new token (its output at the last position is the new token's).
Each time is the fastest of its repeats (the median is recorded beside it): on a shared machine other jobs only
ever add time, so the minimum is the least disturbed reading.
Ratios: HKT uncached / HKT cached, HKT cached / MHA cached, HKT uncached / MHA cached. Writes
results/bench_decoding_<device>.json and a text copy of the printed table (.txt). Run from the repository root:

    python scripts/bench_decoding.py            # about 1-2 minutes on one CPU thread
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from bench_cost import cpu_name  # noqa: E402  (scripts/ is on sys.path when this file runs as a script)

from hkt_nb.attention import HierarchicalAttention, MultiHeadAttention  # noqa: E402
from hkt_nb.decoding import layer_cache, prefill, step  # noqa: E402


def timed(fn, repeats: int) -> list[float]:
    "Wall times of `repeats` calls of `fn()` (after one warm-up call), in seconds."
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


@torch.no_grad()
def measure(layer, T: int, D: int, steps: int, repeats: int) -> dict:
    """Seconds per token at context length T, cached (`steps` steps from a prefill of T - 1 positions, the first
    dropped) and uncached (`repeats` full forwards on T positions): the fastest (`_s`) and the median (`_median_s`)."""
    x = torch.randn(1, T + steps, D)
    cache = layer_cache(layer, 1)
    prefill(layer, x[:, : T - 1], cache)
    cached = []
    for i in range(T - 1, T - 1 + steps):
        start = time.perf_counter()
        step(layer, x[:, i : i + 1], cache)
        cached.append(time.perf_counter() - start)
    uncached = timed(lambda: layer(x[:, :T]), repeats)
    return {"cached_s": min(cached[1:]), "cached_median_s": statistics.median(cached[1:]),
            "uncached_s": min(uncached), "uncached_median_s": statistics.median(uncached)}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--n-heads", type=int, default=4)
    parser.add_argument("--n-levels", type=int, default=3)
    parser.add_argument("--stride", type=int, default=2)
    parser.add_argument("--steps", type=int, default=41, help="cached steps timed per length (the first is dropped)")
    parser.add_argument("--repeats", type=int, default=5, help="uncached full forwards timed per length")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench_decoding_cpu.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    D, H = args.d_model, args.n_heads
    layers = {"HKT": HierarchicalAttention(D, H, args.n_levels, args.stride, causal=True).eval(),
              "MHA": MultiHeadAttention(D, H, causal=True).eval()}
    rows, lines = [], []
    header = f"{'T':>6} {'HKT cached ms':>14} {'HKT uncached ms':>16} {'MHA cached ms':>14} {'MHA uncached ms':>16} " \
             f"{'HKT unc/cached':>15} {'HKT/MHA cached':>15} {'HKT unc/MHA cached':>19}"
    print(header)
    lines.append(header)
    start = time.perf_counter()
    for T in args.lengths:
        row = {"T": T}
        for name, layer in layers.items():  # both layers at this T before the next T: they share the machine's state
            for key, value in measure(layer, T, D, args.steps, args.repeats).items():
                row[f"{name}_{key}"] = value
        row["hkt_uncached_over_cached"] = row["HKT_uncached_s"] / row["HKT_cached_s"]
        row["hkt_over_mha_cached"] = row["HKT_cached_s"] / row["MHA_cached_s"]
        row["hkt_uncached_over_mha_cached"] = row["HKT_uncached_s"] / row["MHA_cached_s"]
        rows.append(row)
        line = (f"{T:>6} {1e3 * row['HKT_cached_s']:>14.3f} {1e3 * row['HKT_uncached_s']:>16.2f} "
                f"{1e3 * row['MHA_cached_s']:>14.3f} {1e3 * row['MHA_uncached_s']:>16.2f} "
                f"{row['hkt_uncached_over_cached']:>15.1f} {row['hkt_over_mha_cached']:>15.2f} "
                f"{row['hkt_uncached_over_mha_cached']:>19.0f}")
        print(line, flush=True)
        lines.append(line)
    meta = {"device": "cpu", "cpu": cpu_name(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "seconds": round(time.perf_counter() - start, 1),
            "config": {"d_model": D, "n_heads": H, "n_levels": args.n_levels, "stride": args.stride, "batch_size": 1,
                       "dtype": "float32", "steps": args.steps, "repeats": args.repeats},
            "note": "cached: fastest of the timed steps from context length T on (prefill of T - 1 positions first); "
                    "uncached: fastest full causal forward on T positions (what a decoder without a cache recomputes "
                    "per token); *_median_s: the medians"}
    result = {"meta": meta, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    args.out.with_suffix(".txt").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out} ({meta['seconds']} s)")
    return result


if __name__ == "__main__":
    main()
