"""Rename a preset's committed results: every file and folder it produced, and the names recorded inside them.

    python scripts/migrations/rename_preset.py OLD NEW [--results results] [--dry-run]
    python scripts/migrations/rename_preset.py cpu cpu_small      # what was done when the first `cpu` preset became `cpu_small`

A preset's runs are named `<task>-<model>-<preset>-seed<k>` (`run_name`, chapter 5) and its trivial baselines
`baselines/<task>-<preset>.json` (chapter 4d). When a preset is redefined under its old name, its new runs would
overwrite the old records, so the old definition is first given a new name (in `PRESETS` and the task registry's
`Task.sizes`) and its results are moved here, with `git mv` so their history follows them:

- run records `<run>.json`, `predictions/<run>.npz`, `checkpoints/<run>.pt`, `pretrained/<run>/` (any other
  tracked path whose name holds `-<OLD>-seed`, e.g. `checkpoints/<run>/`);
- baselines `baselines/<task>-<OLD>.json` and `baselines/predictions/<task>-<OLD>-<baseline>.npz`;
- the executed experiment chapters `chapters/<OLD>/`.

Inside them it rewrites what names the run or the preset: a record's `run`, `preset`, `checkpoint_dir`,
`model_path`, `predictions_path`; a baselines file's `preset`; a checkpoint's `run`; a model card's title and
preset row. Files of other modules that reuse the preset name for their own runs (results/lm/, results/pilot/) are
left alone. Idempotent: a second call finds nothing to rename. After renaming (or alone, with `--check`) it reads
everything back with the library's own readers (`check`): each record is a finished run of NEW (`finished_run`), its
predictions give its test accuracy, its checkpoint and pretrained folder load the same weights, and the baselines
load and match their predictions.

    python scripts/migrations/rename_preset.py cpu cpu_small --check   # the checks only
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIPPED = ("lm/", "pilot/")  # other modules' runs (their own presets), relative to the results folder


def tracked(results: Path) -> list[str]:
    "The tracked files under `results`, relative to it (POSIX paths)."
    out = subprocess.run(["git", "ls-files", "-z", "--", str(results)], cwd=ROOT, check=True,
                         capture_output=True).stdout.decode()
    base = results.resolve().relative_to(ROOT).as_posix().rstrip("/") + "/"
    return [p[len(base):] for p in out.split("\0") if p and p.startswith(base)]


def renamed(relative: str, old: str, new: str) -> str | None:
    "The new relative path of a file of preset `old`, or None when the file is not one of that preset's."
    if relative.startswith(SKIPPED):
        return None
    parts = relative.split("/")
    if parts[0] == "chapters" and len(parts) > 2 and parts[1] == old:
        return "/".join(["chapters", new, *parts[2:]])
    if parts[0] == "baselines":
        name = parts[-1]
        if len(parts) == 2 and re.fullmatch(rf"[a-z][a-z0-9_]*-{re.escape(old)}\.json", name):
            return f"baselines/{name[: -len(f'-{old}.json')]}-{new}.json"
        match = re.fullmatch(rf"([a-z][a-z0-9_]*)-{re.escape(old)}-(.+\.npz)", name)
        if len(parts) == 3 and parts[1] == "predictions" and match:
            return f"baselines/predictions/{match[1]}-{new}-{match[2]}"
        return None
    marker = f"-{old}-seed"
    if any(marker in part for part in parts):
        return "/".join(part.replace(marker, f"-{new}-seed") for part in parts)
    return None


def rewrite_record(path: Path, old: str, new: str) -> None:
    "A run record's names (key order and the loop's `indent=1` layout kept)."
    record = json.loads(path.read_text())
    old_run = record["run"]
    new_run = old_run.replace(f"-{old}-seed", f"-{new}-seed")
    record["run"] = new_run
    if record.get("preset") == old:
        record["preset"] = new
    for key in ("checkpoint_dir", "model_path", "predictions_path"):
        if isinstance(record.get(key), str):
            record[key] = record[key].replace(old_run, new_run)
    path.write_text(json.dumps(record, indent=1) + "\n")


def rewrite_baselines(path: Path, old: str, new: str) -> None:
    "A baselines file's preset (sorted keys, `indent=1`, as `save_baselines` writes it)."
    body = json.loads(path.read_text())
    if body.get("preset") == old:
        body["preset"] = new
    path.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")


def rewrite_checkpoint(path: Path, old: str, new: str) -> None:
    "The `run` a `.pt` checkpoint stores (loaded and saved again with torch; tensors unchanged)."
    import torch

    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    if isinstance(checkpoint, dict) and isinstance(checkpoint.get("run"), str) and f"-{old}-seed" in checkpoint["run"]:
        checkpoint["run"] = checkpoint["run"].replace(f"-{old}-seed", f"-{new}-seed")
        torch.save(checkpoint, path)


def rewrite_card(path: Path, old: str, new: str) -> None:
    "A model card's title (the run name) and its preset row."
    text = path.read_text(encoding="utf-8")
    text = re.sub(rf"(\S)-{re.escape(old)}-seed(\d+)", rf"\1-{new}-seed\2", text)
    text = text.replace(f"| preset | `{old}` |", f"| preset | `{new}` |")
    path.write_text(text, encoding="utf-8")


def check(new: str, results: Path) -> int:
    """Read preset `new`'s renamed results back with the library's readers; AssertionError naming the first file
    that fails. Returns the number of run records checked."""
    import numpy as np
    import torch

    from hkt_nb.lra.baselines import load_baselines
    from hkt_nb.lra.results import load_predictions, load_runs
    from hkt_nb.lra.runs import finished_run
    from hkt_nb.model import HKTClassifier

    paths = sorted(results.glob(f"*-{new}-seed*.json"))
    assert len(load_runs(results, new)) == len(paths), "some records do not conform to the preset"
    for path in paths:
        record = json.loads(path.read_text())
        name = path.stem
        assert record["run"] == name and record["preset"] == new, path
        assert finished_run(record["task"], record["model"], new, record["seed"], results) is not None, path
        loaded = load_predictions(results, record)
        if loaded is not None:
            assert abs(float((loaded[0] == loaded[1]).mean()) - record["test_acc"]) < 1e-9, path
        if record.get("model_path"):
            model = HKTClassifier.from_checkpoint(results / record["model_path"])
            assert torch.load(results / record["model_path"], map_location="cpu", weights_only=False)["run"] == name
            folder = results / "pretrained" / name
            if folder.is_dir():
                shared = HKTClassifier.from_pretrained(folder).state_dict()
                assert all(torch.equal(v, shared[k]) for k, v in model.state_dict().items()), folder
                assert f"# {name}" in (folder / "README.md").read_text(encoding="utf-8"), folder
    for task, body in load_baselines(results, new).items():
        assert body["preset"] == new, task
        for baseline, entry in body["baselines"].items():
            saved = np.load(results / "baselines" / "predictions" / f"{task}-{new}-{baseline}.npz")
            assert abs(float((saved["predictions"] == saved["labels"]).mean()) - entry["test_acc"]) < 1e-9, (task, baseline)
    return len(paths)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old"), parser.add_argument("new")
    parser.add_argument("--results", default="results", help="the results folder (default: results)")
    parser.add_argument("--dry-run", action="store_true", help="print the moves only")
    parser.add_argument("--check", action="store_true", help="only read NEW's results back (`check`)")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"[a-z][a-z0-9_]*", args.new) or args.old == args.new:
        raise SystemExit(f"NEW must be a new preset name of [a-z0-9_] (no '-': it is part of run names), got {args.new!r}")
    results = (ROOT / args.results) if not Path(args.results).is_absolute() else Path(args.results)
    if str(ROOT) not in sys.path:  # this checkout's hkt_nb
        sys.path.insert(0, str(ROOT))
    if args.check:
        print(f"{check(args.new, results)} run record(s) of {args.new!r} read back with the library's readers")
        return
    moves = {rel: target for rel in tracked(results) if (target := renamed(rel, args.old, args.new))}
    for rel, target in moves.items():
        print(f"{rel} -> {target}")
        if args.dry_run:
            continue
        (results / target).parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "mv", str(results / rel), str(results / target)], cwd=ROOT, check=True)
        path = results / target
        if target.startswith("chapters/"):
            continue  # executed notebooks: regenerated by `make chapters PRESET=<new>`, not edited
        if path.suffix == ".json" and target.startswith("baselines/"):
            rewrite_baselines(path, args.old, args.new)
        elif path.suffix == ".json" and "/" not in target:
            rewrite_record(path, args.old, args.new)
        elif path.suffix == ".pt":
            rewrite_checkpoint(path, args.old, args.new)
        elif path.name == "README.md" and target.startswith("pretrained/"):
            rewrite_card(path, args.old, args.new)
    print(f"{len(moves)} file(s) {'would be ' if args.dry_run else ''}renamed from {args.old!r} to {args.new!r}")
    if not args.dry_run:
        print(f"{check(args.new, results)} run record(s) of {args.new!r} read back with the library's readers")


if __name__ == "__main__":
    sys.exit(main())
