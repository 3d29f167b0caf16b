#!/usr/bin/env python
"""The GPU check of issue 12: one command that a machine with one CUDA GPU runs in under 8 minutes, recording
everything it measures under results/gpu/ (run from the repository root):

    python scripts/gpu_check.py              # `make gpu-check`: on the GPU, writes results/gpu/
    python scripts/gpu_check.py --dry-run    # `make gpu-check-dry`: every step on the CPU at toy size (~1 min),
                                             # writes _build/gpu_check_dry/; part of `make test`, so it cannot rot

Steps (each one's exit status, wall time and output file go to <out>/summary.json; a failing step does not stop
the next):
  1. environment   torch, GPU name, compute capability, the precision amp="auto" picks, SDPA backends enabled
  2. cuda tests    `pytest -m cuda tests/test_cuda.py`: fp32 fused == explicit, finite bf16 / fp16 training
                   steps, SDPA on flash / memory-efficient kernels only, memory linear in T up to 16,384
  3. bench_cost    scripts/bench_cost.py --device cuda, T = 1,024 .. 16,384: HKT fused / MHA time and memory
  4. flex-bench    HKT's fused form beside the experimental impl="flex" (hkt_nb.experimental.flex), same table:
                   forward+backward time and peak memory per T (up to 16,384; dry run: T = 64 on the CPU, where
                   flex runs its forward pass only, under no_grad, and says so in its row)
  5. listops       the `paper`-preset ListOps model, hkt and mha, each trained for a wall-clock budget that stops
                   cleanly between steps; records how far it got and its throughput (examples/s). The training
                   split is capped (--listops-train, default 6,000 examples: generating the full 96,000 takes
                   longer than the whole check); the throughput does not depend on the split size.
  6. decode-bench  cached decoding (hkt_nb.decoding, issue 34): one layer's `step`, HKT (L = 3) and standard attention,
                   D = 512, H = 8, batch 1, on a fixed-capacity cache (`layer_cache(..., capacity=)`) at T = 1,024 and
                   4,096: eager, and compiled with torch.compile(mode="reduce-overhead") (CUDA graphs), per-step time,
                   the number of graphs compiled over the timed steps (1 = no recompilation), CUDA-graph skips and the
                   compiled step's largest difference from the eager one (dry run: D = 16 on the CPU, the eager
                   backend of torch.compile, T = 64)
  7. lm            the byte-level language model of chapter 15 (`hkt_nb.lm`, `paper` preset: D = 512, 8 blocks,
                   T = 1,024, batch 32), HKT with 3 levels and parameter-matched standard attention, each trained for
                   --lm-steps steps (default 300) or the --budget seconds, whichever comes first, under bf16 autocast;
                   records tokens/s (after 5 warm-up steps), peak memory and the loss (IMDB bytes when
                   $HKT_DATA_DIR holds them, else synthetic bytes: the throughput does not depend on the text).
  8. accuracy      scripts/gpu_results.py: ListOps at the paper's length, HKT and MHA, one seed each under a stated
                   time budget, with full-test predictions (results/gpu/accuracy/). Its data are prepared on the CPU
                   beforehand (`make gpu-data`), so on a GPU it is a device call of its own, `make gpu-results`, and
                   not part of the default steps; the dry run runs it whole (prepare + train) on the CPU at toy size.
Nothing here is a result of the book until a run on a GPU has been recorded and committed.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def environment(device: str) -> dict:
    "What the machine is and what the library will choose on it."
    import torch

    from hkt_nb.lra.config import TrainConfig
    from hkt_nb.train.distributed import amp_dtype, execution_settings
    info = {"torch": torch.__version__, "cuda_available": torch.cuda.is_available(), "device": device,
            "python": sys.version.split()[0], "cpu_count": os.cpu_count()}
    target = torch.device(device)
    if target.type == "cuda":
        info.update(gpu=torch.cuda.get_device_name(target), capability=list(torch.cuda.get_device_capability(target)),
                    memory_gib=round(torch.cuda.get_device_properties(target).total_memory / 2**30, 1),
                    cuda=torch.version.cuda, bf16_supported_report=torch.cuda.is_bf16_supported(),
                    flash_sdp_enabled=torch.backends.cuda.flash_sdp_enabled(),
                    mem_efficient_sdp_enabled=torch.backends.cuda.mem_efficient_sdp_enabled())
    info["amp_auto"] = str(amp_dtype(target, "auto"))
    info["execution_settings"] = execution_settings(TrainConfig(), target)
    return info


def run_step(name: str, command: list[str], out: Path, env: dict, timeout: float) -> dict:
    "Run one step as a subprocess with a timeout; its output goes to <out>/<name>.log."
    started = time.time()
    log = out / f"{name}.log"
    print(f"[gpu-check] {name}: {' '.join(command)}", flush=True)
    try:
        with open(log, "w") as handle:
            code = subprocess.run(command, cwd=ROOT, env={**os.environ, **env}, stdout=handle, stderr=subprocess.STDOUT,
                                  timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        code = "timeout"
    seconds = round(time.time() - started, 1)
    print(f"[gpu-check] {name}: exit {code} after {seconds} s (log {log.relative_to(ROOT) if log.is_relative_to(ROOT) else log})",
          flush=True)
    return {"step": name, "exit": code, "seconds": seconds, "log": log.name, "command": command}


def listops_budget_run(model: str, args) -> dict:
    "Train `model` with the paper preset's model and batch for `args.budget` seconds; the record of how far it got."
    from hkt_nb.lra.loop import train
    task, preset = ("synthetic", "smoke") if args.dry_run else ("listops", "paper")
    caps = {} if args.dry_run else {"n_train": args.listops_train, "n_val": 1000, "n_test": 2000}
    started = time.time()
    record = train(task, model, preset, 0, device=args.device, results_dir=args.out / "runs",
                   checkpoint_dir=args.out / "runs" / "checkpoints" / model, resume=False, progress=False,
                   time_budget_s=args.budget, train_overrides=caps)
    keep = ("run", "complete", "task", "model", "preset", "config", "data", "n_params", "history", "time_budget",
            "train_examples_per_s", "amp_dtype", "hardware", "test_acc")
    summary = {k: record[k] for k in keep if k in record}
    summary["wall_s_including_data_and_compile"] = round(time.time() - started, 1)
    (args.out / f"listops_{model}_budget.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def lm_budget_run(model: str, args) -> dict:
    "A few hundred training steps of chapter 15's byte LM (`model` a key of `hkt_nb.lm.LM_MODELS`): throughput, memory."
    import torch

    from hkt_nb.lm import (
        LM_PRESETS,
        ByteLM,
        configure_optimizer,
        count_lm_parameters,
        imdb_bytes,
        lm_loss,
        lm_model_config,
        lr_at,
        random_batch,
    )
    preset = "smoke" if args.dry_run else "paper"
    cfg, train = lm_model_config(model, preset), LM_PRESETS[preset].train
    device = torch.device(args.device)
    text, source = None, "synthetic"
    if os.environ.get("HKT_DATA_DIR") and os.path.isdir(os.environ["HKT_DATA_DIR"]):
        try:
            text, source = imdb_bytes("train", max_bytes=4_000_000), "imdb train"
        except (FileNotFoundError, ImportError) as e:
            print(f"[lm] no IMDB bytes ({e}); synthetic bytes instead", flush=True)
    if text is None:  # bytes of a random word salad over a small alphabet
        rng = torch.Generator().manual_seed(0)
        text = torch.randint(97, 123, (4_000_000,), generator=rng, dtype=torch.uint8)
        text[torch.randint(0, len(text), (len(text) // 6,), generator=rng)] = 32
    else:
        text = torch.frombuffer(bytearray(text), dtype=torch.uint8)
    torch.manual_seed(0)
    net = ByteLM(cfg).to(device)
    optimizer = configure_optimizer(net, train.lr, train.weight_decay, train.betas)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    warmup, losses, started, timed_from = 5, [], time.time(), None
    for step in range(args.lm_steps):
        if step == warmup:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            timed_from = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, train)
        x, y = random_batch(text, train.batch_size, cfg.max_len)
        with amp:
            loss = lm_loss(net(x.to(device, non_blocking=True)), y.to(device, non_blocking=True))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), train.grad_clip)
        optimizer.step()
        losses.append(loss.item())
        if time.time() - started > args.budget and step >= warmup + 1:
            break
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    timed_steps = len(losses) - warmup
    seconds = time.perf_counter() - timed_from if timed_from else float("nan")
    summary = {"model": model, "preset": preset, "config": cfg.to_dict(), "n_params": count_lm_parameters(net),
               "batch_size": train.batch_size, "steps": len(losses), "timed_steps": timed_steps,
               "tokens_per_s": round(timed_steps * train.batch_size * cfg.max_len / seconds, 1) if timed_steps > 0 else None,
               "peak_memory_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 3) if device.type == "cuda" else None,
               "amp_dtype": "bfloat16" if device.type == "cuda" else None, "text": source,
               "loss_bits_first": losses[0] / 0.6931471805599453, "loss_bits_last": losses[-1] / 0.6931471805599453,
               "wall_s": round(time.time() - started, 1)}
    (args.out / f"lm_{model}.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"[lm] {model}: {json.dumps({k: summary[k] for k in ('n_params', 'steps', 'tokens_per_s', 'peak_memory_gib')})}",
          flush=True)
    return summary


def _flex_row(impl: str, T: int, B: int, D: int, H: int, device, repeats: int, reference=None) -> dict:
    "One row of the flex benchmark: `impl` of a seeded HKT layer (L = 3) on (B, T, D), timed and measured."
    import torch

    from hkt_nb.attention import HierarchicalAttention
    torch.manual_seed(0)
    layer = HierarchicalAttention(D, H, n_levels=3).to(device).eval()
    x = torch.randn(B, T, D, device=device)
    cuda = device.type == "cuda"
    backward = cuda or impl != "flex"  # FlexAttention has no CPU backward
    row = {"impl": impl, "T": T, "B": B, "D": D, "H": H, "device": str(device),
           "mode": "forward+backward" if backward else "forward only, no_grad (FlexAttention has no CPU backward)"}

    def step():
        if backward:
            out = layer(x.requires_grad_(), impl=impl)
            out.square().mean().backward()
        else:
            with torch.no_grad():
                out = layer(x, impl=impl)
        return out.detach()
    try:
        out = step()  # warm-up (compiles the flex kernel on CUDA)
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        started = time.perf_counter()
        for _ in range(repeats):
            step()
        if cuda:
            torch.cuda.synchronize(device)
            row["peak_mib"] = round((torch.cuda.max_memory_allocated(device) - base) / 2**20, 1)
        else:
            row["peak_mib"] = None  # torch does not track CPU allocations
        row["ms"] = round((time.perf_counter() - started) / repeats * 1e3, 2)
        if reference is not None:
            row["max_abs_diff_vs_fused"] = float((out - reference).abs().max())
        row["output"] = out
    except Exception as error:  # noqa: BLE001 - a row records why it could not run
        row["mode"] = "skipped: needs CUDA" if not cuda else f"failed: {type(error).__name__}: {error}"[:200]
    return row


def flex_benchmark(args) -> list[dict]:
    "HKT fused and experimental flex, forward+backward time and peak memory, in one table (<out>/flex_bench.json)."
    import warnings

    import torch
    device = torch.device(args.device)
    if device.type != "cuda":  # the uncompiled CPU form says it materialises the scores: the row says it too
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    if args.dry_run:
        lengths, B, D, H, repeats = [64], 1, 16, 2, 2
    else:
        lengths, B, D, H, repeats = [T for T in (1024, 4096, 16384) if T <= args.max_length], 2, 128, 4, 5
    rows = []
    for T in lengths:
        fused = _flex_row("fused", T, B, D, H, device, repeats)
        rows += [fused, _flex_row("flex", T, B, D, H, device, repeats, fused.get("output"))]
    for row in rows:
        row.pop("output", None)
    print(f"{'impl':<6} {'T':>6} {'B':>2} {'D':>4} {'H':>2} {'ms':>9} {'peak MiB':>9} {'|flex-fused|':>12}  mode")
    for r in rows:
        ms = "-" if r.get("ms") is None else f"{r['ms']:.2f}"
        peak = "-" if r.get("peak_mib") is None else f"{r['peak_mib']:.1f}"
        diff = f"{r['max_abs_diff_vs_fused']:.2e}" if "max_abs_diff_vs_fused" in r else "-"
        print(f"{r['impl']:<6} {r['T']:>6} {r['B']:>2} {r['D']:>4} {r['H']:>2} {ms:>9} {peak:>9} {diff:>12}  {r['mode']}")
    (args.out / "flex_bench.json").write_text(json.dumps(rows, indent=1) + "\n")
    return rows


def _decode_row(kind: str, T: int, D: int, H: int, device, steps: int, dry_run: bool) -> dict:
    "One layer's cached step at context T on a fixed-capacity cache: eager and compiled, ms per step."
    import torch
    from torch._dynamo.utils import counters

    from hkt_nb.attention import HierarchicalAttention, MultiHeadAttention
    from hkt_nb.decoding import layer_cache, prefill, step
    torch.manual_seed(0)
    layer = (HierarchicalAttention(D, H, 3, causal=True) if kind == "hkt" else MultiHeadAttention(D, H, causal=True))
    layer = layer.to(device).eval()
    x = torch.randn(1, T + 2 * steps + 8, D, device=device)
    cuda = device.type == "cuda"
    row = {"layer": kind, "T": T, "D": D, "H": H, "steps": steps, "device": str(device),
           "compile": "eager backend (dry run)" if dry_run else 'mode="reduce-overhead"'}

    def run(fn, cache, start, n):
        outs = []
        if cuda:
            torch.cuda.synchronize(device)
        began = time.perf_counter()
        for i in range(start, start + n):
            outs.append(fn(layer, x[:, i : i + 1], cache).clone())
        if cuda:
            torch.cuda.synchronize(device)
        return (time.perf_counter() - began) / n * 1e3, torch.cat(outs, 1)
    try:
        capacity = T + 2 * steps + 8
        eager_cache, compiled_cache = layer_cache(layer, 1, capacity), layer_cache(layer, 1, capacity)
        prefill(layer, x[:, :T], eager_cache)
        prefill(layer, x[:, :T], compiled_cache)
        run(step, eager_cache, T, 3)  # warm-up
        row["eager_ms"], eager_out = run(step, eager_cache, T + 3, steps)
        torch._dynamo.reset()
        counters.clear()
        compiled = torch.compile(step, fullgraph=True, **({"backend": "eager"} if dry_run else {"mode": "reduce-overhead"}))
        started = time.perf_counter()
        run(compiled, compiled_cache, T, 3)  # compiles, records the graph
        row["compile_s"] = round(time.perf_counter() - started, 1)
        row["compiled_ms"], compiled_out = run(compiled, compiled_cache, T + 3, steps)
        row["graphs"] = counters["stats"]["unique_graphs"]
        row["cudagraph_skips"] = sum(counters["inductor"].get(k, 0) for k in counters["inductor"] if "cudagraph_skip" in k)
        row["max_abs_diff_compiled_vs_eager"] = float((compiled_out - eager_out).abs().max())
    except Exception as error:  # noqa: BLE001 - a row records why it could not run
        row["failed"] = f"{type(error).__name__}: {error}"[:300]
    return row


def decode_benchmark(args) -> list[dict]:
    "Cached decoding steps of HKT and MHA, eager and compiled (<out>/decode_bench.json); the table in the log."
    import torch
    device = torch.device(args.device)
    lengths, D, H, steps = ([64], 16, 2, 20) if args.dry_run else ([1024, 4096], 512, 8, 100)
    rows = [_decode_row(kind, T, D, H, device, steps, args.dry_run) for T in lengths for kind in ("hkt", "mha")]
    print(f"{'layer':<5} {'T':>6} {'eager ms':>9} {'compiled ms':>12} {'graphs':>7} {'compile s':>10}  compile")
    for r in rows:
        if "failed" in r:
            print(f"{r['layer']:<5} {r['T']:>6}  failed: {r['failed']}")
            continue
        print(f"{r['layer']:<5} {r['T']:>6} {r['eager_ms']:>9.3f} {r['compiled_ms']:>12.3f} {r['graphs']:>7} "
              f"{r['compile_s']:>10.1f}  {r['compile']}")
    for T in lengths:
        pair = {r["layer"]: r for r in rows if r["T"] == T and "failed" not in r}
        if len(pair) == 2:
            print(f"T = {T}: HKT / MHA eager {pair['hkt']['eager_ms'] / pair['mha']['eager_ms']:.2f}, "
                  f"compiled {pair['hkt']['compiled_ms'] / pair['mha']['compiled_ms']:.2f}")
    (args.out / "decode_bench.json").write_text(json.dumps(rows, indent=1) + "\n")
    failed = [r for r in rows if "failed" in r or r.get("graphs") != 1]
    if failed:
        raise SystemExit(f"decode-bench: {len(failed)} rows failed or recompiled")
    return rows


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="every step on the CPU at toy size")
    parser.add_argument("--out", type=Path, default=None, help="default results/gpu (dry run: _build/gpu_check_dry)")
    parser.add_argument("--budget", type=float, default=None, help="seconds of training per model (default 60; dry 0.5)")
    parser.add_argument("--listops-train", type=int, default=6000, help="training examples of the budgeted runs")
    parser.add_argument("--max-length", type=int, default=None, help="longest T measured (default 16384; dry 256)")
    parser.add_argument("--lm-steps", type=int, default=None, help="training steps of each LM model (default 300; dry 8)")
    steps = ["environment", "cuda-tests", "bench-cost", "flex-bench", "decode-bench", "listops", "lm", "accuracy"]
    parser.add_argument("--steps", nargs="+", default=None, choices=steps,
                        help="default: all (on a GPU all but accuracy, which is `make gpu-results`, a device call of its own)")
    parser.add_argument("--listops-only", default=None, help=argparse.SUPPRESS)  # internal: one budgeted run
    parser.add_argument("--flex-only", action="store_true", help=argparse.SUPPRESS)  # internal: the flex table
    parser.add_argument("--lm-only", default=None, help=argparse.SUPPRESS)  # internal: one LM model's steps
    parser.add_argument("--decode-only", action="store_true", help=argparse.SUPPRESS)  # internal: the decode table
    args = parser.parse_args(argv)
    args.device = "cpu" if args.dry_run else "cuda"
    args.steps = args.steps or (steps if args.dry_run else steps[:-1])
    args.out = (args.out or ROOT / ("_build/gpu_check_dry" if args.dry_run else "results/gpu")).resolve()
    args.budget = args.budget if args.budget is not None else (0.5 if args.dry_run else 60.0)
    args.max_length = args.max_length or (256 if args.dry_run else 16384)
    args.lm_steps = args.lm_steps or (8 if args.dry_run else 300)
    return args


def bench_command(args) -> list[str]:
    "scripts/bench_cost.py up to T = max_length (toy sizes in the dry run)."
    command = [sys.executable, "scripts/bench_cost.py", "--device", args.device, "--out", str(args.out / f"bench_cost_{args.device}.json")]
    if args.dry_run:
        return command + ["--lengths", "64", "--sweep-length", "64", "--sweep-levels", "2", "--batch", "1",
                          "--d-model", "16", "--heads", "2", "--repeats", "1", "--min-time", "0", "--warmup", "0"]
    lengths = [str(T) for T in (1024, 2048, 4096, 8192, 16384) if T <= args.max_length]
    return command + ["--lengths", *lengths, "--sweep-length", "4096", "--batch", "2", "--min-time", "0.3",
                      "--mem-cap-gb", "24"]


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.listops_only:
        listops_budget_run(args.listops_only, args)
        return 0
    if args.flex_only:
        flex_benchmark(args)
        return 0
    if args.lm_only:
        lm_budget_run(args.lm_only, args)
        return 0
    if args.decode_only:
        decode_benchmark(args)
        return 0
    if not args.dry_run:
        import torch
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA GPU here: run `python scripts/gpu_check.py --dry-run` (or `make gpu-check-dry`)")
    args.out.mkdir(parents=True, exist_ok=True)
    started, steps = time.time(), []
    if "environment" in args.steps:
        info = environment(args.device)
        (args.out / "environment.json").write_text(json.dumps(info, indent=1) + "\n")
        print(f"[gpu-check] environment: {info}", flush=True)
        steps.append({"step": "environment", "exit": 0, "file": "environment.json"})
    env = {"HKT_TEST_DEVICE": args.device, "HKT_GPU_CHECK_MAX_T": str(args.max_length),
           "HKT_GPU_CHECK_OUT": str(args.out / "cuda_tests"), "PYTHONPATH": str(ROOT)}
    if "cuda-tests" in args.steps:
        steps.append(run_step("cuda-tests", [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda",
                                             "tests/test_cuda.py", f"--junitxml={args.out / 'cuda_tests.xml'}"],
                              args.out, env, timeout=600 if args.dry_run else 240))
    if "bench-cost" in args.steps:
        steps.append(run_step("bench-cost", bench_command(args), args.out, env, timeout=300 if args.dry_run else 150))
    if "flex-bench" in args.steps:
        command = [sys.executable, "scripts/gpu_check.py", "--flex-only", "--max-length", str(args.max_length),
                   "--out", str(args.out)] + (["--dry-run"] if args.dry_run else [])
        steps.append(run_step("flex-bench", command, args.out, env, timeout=300 if args.dry_run else 180))
        print((args.out / "flex-bench.log").read_text(), flush=True)  # the table, in the check's own output
    if "decode-bench" in args.steps:
        command = [sys.executable, "scripts/gpu_check.py", "--decode-only", "--out", str(args.out)] + (["--dry-run"] if args.dry_run else [])
        steps.append(run_step("decode-bench", command, args.out, env, timeout=300 if args.dry_run else 360))
        print((args.out / "decode-bench.log").read_text(), flush=True)
    if "listops" in args.steps:
        for model in ("hkt", "mha"):
            command = [sys.executable, "scripts/gpu_check.py", "--listops-only", model, "--budget", str(args.budget),
                       "--listops-train", str(args.listops_train), "--out", str(args.out)] + (["--dry-run"] if args.dry_run else [])
            steps.append(run_step(f"listops-{model}", command, args.out, env, timeout=args.budget + 240))
    if "lm" in args.steps:
        for model in ("hkt_l3", "mha"):
            command = [sys.executable, "scripts/gpu_check.py", "--lm-only", model, "--budget", str(args.budget),
                       "--lm-steps", str(args.lm_steps), "--out", str(args.out)] + (["--dry-run"] if args.dry_run else [])
            steps.append(run_step(f"lm-{model}", command, args.out, env, timeout=args.budget + 180))
            print((args.out / f"lm-{model}.log").read_text(), flush=True)
    if "accuracy" in args.steps:  # scripts/gpu_results.py: prepare + train (dry: both on the CPU at toy size)
        command = [sys.executable, "scripts/gpu_results.py", "dry-run" if args.dry_run else "train", "--out",
                   str(args.out / "accuracy")]
        steps.append(run_step("accuracy", command, args.out, env, timeout=600))
        print((args.out / "accuracy.log").read_text()[-2000:], flush=True)
    summary = {"dry_run": args.dry_run, "device": args.device, "wall_s": round(time.time() - started, 1), "steps": steps,
               "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    failed = [s["step"] for s in steps if s["exit"] != 0]
    print(f"[gpu-check] {'dry run ' if args.dry_run else ''}done in {summary['wall_s']} s; "
          f"{'failed: ' + ', '.join(failed) if failed else 'all steps passed'}; records in {args.out}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
