#!/usr/bin/env python
"""Benchmark: per-token decoding time of one causal attention layer, with and without a cache (hkt_nb.decoding),
and the generation speed of a whole byte-level language model (hkt_nb.lm), HKT beside standard attention.

Everything runs in ONE process on one thread, HKT and standard attention interleaved, so that the ratios are
measured under the same machine state. Times are the thread's CPU time (`time.thread_time`): on a shared machine a
preempted step is not charged the time it waited (it still shares the caches with the other jobs, so the absolute
times carry the load); the cached steps' wall-clock medians are recorded beside them (`*_cached_wall_s`).

  layer     for each context length T (default 256..4,096) and each layer, HKT (`HierarchicalAttention(causal=True)`,
            L = 3, s = 2) and standard attention (`MultiHeadAttention(causal=True)`): `prefill` the T - 1 first
            positions, then `--rounds` rounds in which each layer takes `--steps` cached `step`s in turn (the order
            alternating between rounds; the cache grows by one position per step). Each step is timed; a layer's
            time is the median over all its steps, and the ratio HKT / MHA is the median over the rounds of the
            ratio of the two layers' medians in that round. The uncached time is the full causal forward on the
            T-position prefix (the work a decoder without a cache repeats per token), the median of `--repeats`.
  generate  the `cpu`-preset `ByteLM` (`hkt_nb.lm`: D = 128, 4 blocks, max_len 256) with HKT (`hkt_l3`) and with
            parameter-matched standard attention (`mha`), untrained (the time does not depend on the weights),
            eval mode: `generate` of `--new-tokens` bytes after a random prompt of `--prompt` bytes (prompt plus new
            bytes within max_len, so the cached decoder never rebuilds its caches), greedy, batch 1 and 8; tokens per
            second = batch x new bytes / wall time (the prefill included), the median of `--gen-rounds` interleaved
            rounds, and the ratio HKT / MHA per round (median).

Writes results/bench_decoding_<device>.json and a text copy of the printed tables (.txt). Run from the repository
root:

    python scripts/bench_decoding.py            # about 1-2 minutes on one CPU thread
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
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


def machine_load() -> list[float] | None:
    "The 1, 5 and 15 minute load averages (None where the OS has none): the record says how busy the machine was."
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return None


@torch.no_grad()
def layer_row(layers: dict, T: int, D: int, steps: int, rounds: int, repeats: int) -> dict:
    "One context length: every layer's cached step (interleaved rounds) and uncached forward, medians and ratios."
    x = torch.randn(1, T + steps * rounds + 1, D)
    caches, pos, times, walls = {}, {}, {name: [] for name in layers}, {name: [] for name in layers}
    for name, layer in layers.items():
        caches[name] = layer_cache(layer, 1)
        prefill(layer, x[:, : T - 1], caches[name])
        pos[name] = T - 1
        step(layer, x[:, pos[name] : pos[name] + 1], caches[name])  # warm-up step (not timed)
        pos[name] += 1
    names, per_round = list(layers), []
    for r in range(rounds):
        medians = {}
        for name in names if r % 2 == 0 else names[::-1]:
            layer, cache, spent = layers[name], caches[name], []
            for _ in range(steps):
                i = pos[name]
                start, wall = time.thread_time(), time.perf_counter()
                step(layer, x[:, i : i + 1], cache)
                spent.append(time.thread_time() - start)
                walls[name].append(time.perf_counter() - wall)
                pos[name] += 1
            times[name] += spent
            medians[name] = statistics.median(spent)
        per_round.append(medians["HKT"] / medians["MHA"])
    row = {"T": T}
    for name, layer in layers.items():
        uncached = []
        for _ in range(repeats):
            start = time.thread_time()
            layer(x[:, :T])
            uncached.append(time.thread_time() - start)
        row[f"{name}_cached_s"] = statistics.median(times[name])
        row[f"{name}_cached_min_s"] = min(times[name])
        row[f"{name}_cached_wall_s"] = statistics.median(walls[name])
        row[f"{name}_uncached_s"] = statistics.median(uncached)
    row["hkt_over_mha_cached"] = statistics.median(per_round)
    row["hkt_over_mha_cached_rounds"] = per_round
    row["hkt_uncached_over_cached"] = row["HKT_uncached_s"] / row["HKT_cached_s"]
    row["hkt_uncached_over_mha_cached"] = row["HKT_uncached_s"] / row["MHA_cached_s"]
    return row


@torch.no_grad()
def generate_rows(prompt: int, new_tokens: int, batch_sizes: list[int], rounds: int) -> list[dict]:
    "Tokens per second of `generate` for the `cpu` ByteLM with HKT and with standard attention, interleaved rounds."
    from hkt_nb.lm import ByteLM, count_lm_parameters, generate, lm_model_config
    models = {}
    for name, key in (("HKT", "hkt_l3"), ("MHA", "mha")):
        torch.manual_seed(0)
        models[name] = ByteLM(lm_model_config(key, "cpu")).eval()
    max_len = models["HKT"].cfg.max_len
    if prompt + new_tokens > max_len:
        raise SystemExit(f"--prompt + --new-tokens must be <= max_len = {max_len} (no cache rebuild), got {prompt + new_tokens}")
    rows = []
    for B in batch_sizes:
        idx = torch.randint(0, 256, (B, prompt), generator=torch.Generator().manual_seed(B))
        for model in models.values():
            generate(model, idx, 8, temperature=0)  # warm-up
        rates, per_round = {name: [] for name in models}, []
        for r in range(rounds):
            got = {}
            for name in list(models) if r % 2 == 0 else list(models)[::-1]:
                start = time.thread_time()
                out = generate(models[name], idx, new_tokens, temperature=0)
                got[name] = B * new_tokens / (time.thread_time() - start)
                assert out.shape == (B, prompt + new_tokens)
                rates[name].append(got[name])
            per_round.append(got["HKT"] / got["MHA"])
        row = {"batch_size": B, "prompt": prompt, "new_tokens": new_tokens}
        for name, model in models.items():
            row[f"{name}_tokens_per_s"] = statistics.median(rates[name])
            row[f"{name}_n_params"] = count_lm_parameters(model)
        row["hkt_over_mha_tokens_per_s"] = statistics.median(per_round)
        row["hkt_over_mha_rounds"] = per_round
        rows.append(row)
    return rows


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--n-heads", type=int, default=4)
    parser.add_argument("--n-levels", type=int, default=3)
    parser.add_argument("--stride", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10, help="cached steps per layer and round")
    parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds per length")
    parser.add_argument("--repeats", type=int, default=3, help="uncached full forwards timed per length")
    parser.add_argument("--prompt", type=int, default=16, help="prompt bytes of the generation benchmark")
    parser.add_argument("--new-tokens", type=int, default=200, help="bytes generated per call")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--gen-rounds", type=int, default=5, help="interleaved generation rounds per batch size")
    parser.add_argument("--no-generate", action="store_true", help="skip the ByteLM generation benchmark")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench_decoding_cpu.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    D, H = args.d_model, args.n_heads
    layers = {"HKT": HierarchicalAttention(D, H, args.n_levels, args.stride, causal=True).eval(),
              "MHA": MultiHeadAttention(D, H, causal=True).eval()}
    rows, lines, load_before = [], [], machine_load()
    header = f"{'T':>6} {'HKT cached ms':>14} {'MHA cached ms':>14} {'HKT/MHA cached':>15} {'HKT uncached ms':>16} " \
             f"{'MHA uncached ms':>16} {'HKT unc/cached':>15}"
    print(header)
    lines.append(header)
    start = time.perf_counter()
    for T in args.lengths:
        row = layer_row(layers, T, D, args.steps, args.rounds, args.repeats)
        rows.append(row)
        line = (f"{T:>6} {1e3 * row['HKT_cached_s']:>14.3f} {1e3 * row['MHA_cached_s']:>14.3f} "
                f"{row['hkt_over_mha_cached']:>15.2f} {1e3 * row['HKT_uncached_s']:>16.2f} "
                f"{1e3 * row['MHA_uncached_s']:>16.2f} {row['hkt_uncached_over_cached']:>15.1f}")
        print(line, flush=True)
        lines.append(line)
    gen_rows = []
    if not args.no_generate:
        header = f"\n{'batch':>6} {'HKT tokens/s':>13} {'MHA tokens/s':>13} {'HKT/MHA':>8}   (ByteLM `cpu`, generate " \
                 f"{args.new_tokens} bytes after {args.prompt})"
        print(header)
        lines.append(header)
        gen_rows = generate_rows(args.prompt, args.new_tokens, args.batch_sizes, args.gen_rounds)
        for row in gen_rows:
            line = (f"{row['batch_size']:>6} {row['HKT_tokens_per_s']:>13.1f} {row['MHA_tokens_per_s']:>13.1f} "
                    f"{row['hkt_over_mha_tokens_per_s']:>8.2f}")
            print(line, flush=True)
            lines.append(line)
    meta = {"device": "cpu", "cpu": cpu_name(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "seconds": round(time.perf_counter() - start, 1),
            "load_average_before": load_before, "load_average_after": machine_load(),
            "config": {"d_model": D, "n_heads": H, "n_levels": args.n_levels, "stride": args.stride, "batch_size": 1,
                       "dtype": "float32", "steps": args.steps, "rounds": args.rounds, "repeats": args.repeats},
            "generate_config": {"preset": "cpu", "models": ["hkt_l3", "mha"], "prompt": args.prompt,
                                "new_tokens": args.new_tokens, "rounds": args.gen_rounds, "greedy": True},
            "note": "measured under load (a shared machine: other jobs running, see the load averages); HKT and MHA "
                    "interleaved in one process on one thread, so the ratios are the reliable numbers; times are "
                    "thread CPU time (time.thread_time), *_cached_wall_s the wall-clock medians. cached: "
                    "median step time from context length T on (prefill of T - 1 positions first); uncached: median "
                    "full causal forward on T positions; hkt_over_mha_cached: median over the rounds of the ratio of "
                    "the two medians in each round"}
    result = {"meta": meta, "rows": rows, "generate": gen_rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    args.out.with_suffix(".txt").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out} ({meta['seconds']} s)")
    return result


if __name__ == "__main__":
    main()
