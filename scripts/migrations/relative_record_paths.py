"""Rewrite absolute paths in run records (results/*.json) as paths relative to the results folder.

    python scripts/migrations/relative_record_paths.py [results]

Runs recorded before records held relative paths stored `checkpoint_dir` as an absolute path of the machine that
ran them; this turns it into the relative form the training loop now writes. Idempotent.
"""
import json
import os
import sys
from pathlib import Path


def main(results_dir: str = "results") -> None:
    for path in sorted(Path(results_dir).glob("*.json")):
        record = json.loads(path.read_text())
        folder = record.get("checkpoint_dir")
        if isinstance(folder, str) and os.path.isabs(folder):
            run = Path(folder).name
            record["checkpoint_dir"] = os.path.join("..", "checkpoints", run)
            path.write_text(json.dumps(record, indent=1) + "\n")
            print(f"{path}: checkpoint_dir -> {record['checkpoint_dir']}")


if __name__ == "__main__":
    main(*sys.argv[1:])
