"""Convert the committed best models, `results/checkpoints/<run>.pt` (torch pickles read by
`HKTClassifier.from_checkpoint`), into pretrained folders `results/pretrained/<run>/` (config.json,
model.safetensors, README.md with the card from `results/<run>.json`; chapter 3a).

    python scripts/migrations/convert_checkpoints.py            # convert; folders already up to date are left alone
    python scripts/migrations/convert_checkpoints.py --check    # write nothing; exit 1 when a folder is missing or differs

Only the `<run>.pt` files are converted, not the per-run folders `checkpoints/<run>/last.pt` of runs in progress.
Each folder is written to a temporary folder first and kept only when the model it loads (`from_pretrained`) has
exactly the weights of the `.pt` model and exactly its logits (`torch.equal`) on a fixed random input; a folder
whose files are byte for byte what the conversion writes is not touched (the script is idempotent).
"""
from __future__ import annotations

import argparse
import filecmp
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hkt_nb.model import HKTClassifier  # noqa: E402
from hkt_nb.pretrained import CARD_NAME, CONFIG_NAME, WEIGHTS_NAME  # noqa: E402

FILES = (CONFIG_NAME, WEIGHTS_NAME, CARD_NAME)


def probe_inputs(model: HKTClassifier, batch: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    "A fixed random batch (batch, max_len) of token ids for `model`, and a padding mask (row k: the last 7k padded)."
    generator = torch.Generator().manual_seed(seed)
    T = model.cfg.max_len
    ids = torch.randint(1, model.cfg.vocab_size, (batch, T), generator=generator) if model.cfg.vocab_size > 1 \
        else torch.zeros(batch, T, dtype=torch.long)
    mask = torch.arange(T).expand(batch, T) >= (T - 7 * torch.arange(batch)).clamp(min=1).unsqueeze(1)
    return ids, mask


def same_model(reference: HKTClassifier, folder: Path) -> str | None:
    "None when `from_pretrained(folder)` has the weights and the logits of `reference` exactly, else what differs."
    loaded = HKTClassifier.from_pretrained(folder)
    if loaded.cfg.to_dict() != reference.cfg.to_dict():
        return f"config {loaded.cfg.to_dict()} != {reference.cfg.to_dict()}"
    ref_state, state = reference.state_dict(), loaded.state_dict()
    unequal = [k for k in ref_state if not torch.equal(ref_state[k], state[k])]
    if unequal:
        return f"tensors differ: {unequal}"
    ids, mask = probe_inputs(reference)
    with torch.no_grad():
        for key_padding_mask in (None, mask):
            if not torch.equal(reference(ids, key_padding_mask), loaded(ids, key_padding_mask)):
                return f"logits differ (key_padding_mask {'given' if key_padding_mask is not None else 'None'})"
    return None


def _same_config(a: Path, b: Path) -> bool:
    "The two config.json files hold the same config; the record of the weights' size and hash (FILES_KEY), which"
    " folders saved before it lack, is left out."
    from hkt_nb.pretrained import FILES_KEY

    def read(path):
        return {k: v for k, v in json.loads(path.read_text()).items() if k != FILES_KEY}
    return read(a) == read(b)


def same_files(a: Path, b: Path) -> bool:
    "Both folders hold the conversion's files, equal byte for byte (the config: as `_same_config` compares it)."
    def same(name):
        if not ((a / name).is_file() and (b / name).is_file()):
            return False
        return _same_config(a / name, b / name) if name == "config.json" else filecmp.cmp(a / name, b / name, shallow=False)
    return all(same(name) for name in FILES)


def convert(checkpoint: Path, results_dir: Path, out_dir: Path, check_only: bool = False) -> str:
    "Convert one `<run>.pt`; returns 'written', 'up to date' or (check_only) 'missing' / 'differs'. Raises on a mismatch."
    run = checkpoint.stem
    model = HKTClassifier.from_checkpoint(checkpoint)
    record = results_dir / f"{run}.json"
    target = out_dir / run
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=f".{run}.") as tmp:
        fresh = model.save_pretrained(Path(tmp) / run, record=record if record.is_file() else None)
        problem = same_model(model, fresh)
        if problem:
            raise RuntimeError(f"{checkpoint}: the converted model is not the checkpoint's: {problem}")
        if target.is_dir() and same_files(fresh, target):
            problem = same_model(model, target)
            if problem:
                raise RuntimeError(f"{target}: {problem}")
            return "up to date"
        if check_only:
            return "differs" if target.exists() else "missing"
        if target.exists():
            shutil.rmtree(target)
        shutil.move(str(fresh), str(target))
    return "written"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results-dir", default=str(ROOT / "results"), help="folder with checkpoints/ and the records")
    p.add_argument("--out-dir", default=None, help="where the folders go (default: <results-dir>/pretrained)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 when a folder is missing or differs")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    results_dir = Path(a.results_dir)
    out_dir = Path(a.out_dir) if a.out_dir else results_dir / "pretrained"
    checkpoints = sorted(path for path in (results_dir / "checkpoints").glob("*.pt") if path.is_file())
    if not checkpoints:
        print(f"no checkpoints in {results_dir / 'checkpoints'}")
        return 1
    bad = []
    for checkpoint in checkpoints:
        status = convert(checkpoint, results_dir, out_dir, a.check)
        print(f"{checkpoint.stem}: {status}")
        if status in ("missing", "differs"):
            bad.append(checkpoint.stem)
    if bad:
        print(f"ERROR: {len(bad)} pretrained folder(s) missing or out of date: run python scripts/migrations/convert_checkpoints.py")
        return 1
    print(f"{len(checkpoints)} checkpoint(s): every pretrained folder in {out_dir} loads the same model")
    return 0


if __name__ == "__main__":
    sys.exit(main())
