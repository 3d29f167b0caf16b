"""Keep the finished runs of a preset whose definition has changed, under the variant names they have today.

    python scripts/migrations/supersede_runs.py --preset cpu --task listops [--dry-run]

When a preset's size for a task changes (the pilot of chapter 5g chose another setting), the committed runs of the
old size no longer conform to the preset (`conforms_to_preset`, chapter 5) and the queue would train the new ones
over their files. This script renames each such run to the name a run of its configuration gets today: the
preset's name with the variant of its differences from the preset (`preset_differences`, `run_variant`, chapter 5),
as if it had been trained as a variant. The record (its `run`, `variant`, `overrides` and paths updated), its
predictions, its model file and its pretrained folder move with `git mv`, so their history stays. Runs that
conform, variants already, and unfinished runs are left alone.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # this checkout's hkt_nb, not another installed copy
    sys.path.insert(0, str(ROOT))


def superseded(results_dir: Path, preset: str, task: str) -> list[Path]:
    "The finished records `<task>-<model>-<preset>-seed<k>.json` that no longer conform to `preset`."
    from hkt_nb.lra.config import conforms_to_preset

    out = []
    for path in sorted(results_dir.glob(f"{task}-*-{preset}-seed*.json")):
        record = json.loads(path.read_text())
        if record.get("complete") and not record.get("variant") and not conforms_to_preset(record, preset):
            out.append(path)
    return out


def variant_record(record: dict) -> dict:
    "The record as the variant it is today: `overrides` = its differences from the preset, `variant`, `run`, paths."
    from hkt_nb.lra.config import TrainConfig, preset_differences, run_name, run_variant

    stored = {k: tuple(v) if isinstance(v, list) else v for k, v in record["config"]["train"].items()}
    differences = preset_differences(record["task"], record["preset"], TrainConfig(**stored))
    if not differences:
        raise ValueError(f"{record['run']}: its training configuration is the preset's; only the model differs, "
                         "which this script does not handle")
    name = run_name(record["task"], record["model"], record["preset"], record["seed"], run_variant(differences))
    moved = {key: record[key].replace(record["run"], name) for key in
             ("checkpoint_dir", "model_path", "pretrained_path", "predictions_path") if record.get(key)}
    return {**record, **moved, "run": name, "variant": run_variant(differences), "overrides": differences,
            "superseded": f"a run of preset {record['preset']!r} until its size for {record['task']} changed"}


def move(source: Path, target: Path, dry_run: bool) -> None:
    "`git mv` for a file or folder git tracks (its history stays), a plain rename otherwise; nothing if absent."
    if not source.exists():
        return
    print(f"  {source} -> {target}")
    if dry_run:
        return
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--error-unmatch", str(source)],
                             capture_output=True).returncode == 0
    if tracked:
        subprocess.run(["git", "-C", str(ROOT), "mv", str(source), str(target)], check=True)
    else:
        source.rename(target)


def write_variants_index(results_dir: Path) -> list[str]:
    """Write `<results_dir>/variants.json` (`VARIANTS_INDEX`, chapter 9), {"runs": the sorted names of the finished variant runs
    there, the list a chapter opened alone fetches them by (`committed_results_dir(..., variants=True)`)}. Returns the names."""
    names = sorted(record["run"] for path in sorted(results_dir.glob("*-seed*.json"))
                   if (record := json.loads(path.read_text())).get("variant") and record.get("complete"))
    (results_dir / "variants.json").write_text(json.dumps({"runs": names}, indent=1) + "\n")
    return names


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cpu")
    parser.add_argument("--task", required=True)
    parser.add_argument("--results-dir", default=str(ROOT / "results"))
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    results = Path(args.results_dir).resolve()
    for path in superseded(results, args.preset, args.task):
        record = json.loads(path.read_text())
        new = variant_record(record)
        print(f"{record['run']} -> {new['run']} ({new['overrides']})")
        for key in ("predictions_path", "model_path", "pretrained_path"):
            if record.get(key):
                move(results / record[key], results / new[key], args.dry_run)
        target = path.with_name(f"{new['run']}.json")
        if not args.dry_run:
            move(path, target, False)
            target.write_text(json.dumps(new, indent=1) + "\n")
    if not args.dry_run:
        write_variants_index(results)


if __name__ == "__main__":
    main()
