"""A run's outputs replaced by a writer killed at every step (issue 35, item 2): `write_outputs` (chapter 5) writes
the marker `.<run>.json.replacing`, the best model, the pretrained folder, the predictions and the record naming
every file with its SHA-256, each atomically (`os.replace`), and removes the marker last. A child process that
retrains a run over an old one is killed (SIGKILL) just before each of its renames, and just before the marker's
removal. A reader must then see the old run whole, the new run whole, or an error that names the interrupted
replacement: never the old record with the new predictions or model. Also: a record beside predictions of another
run (a copy), and a later write clearing what a killed one left. The training checkpoint, one file, is killed in
the middle of its write, before its fsync, before and after its rename: it reads back as the old one or the new one."""
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hkt_nb.train.records import (
    UnreadableRecordError,
    check_written_file,
    file_sha256,
    read_predictions,
    read_record,
    replacing_marker,
    save_predictions,
)

RUN = "synthetic-hkt-smoke-seed0"

# the child: `write_outputs` of a stand-in run whose test predictions and weights are set by `version` (0: the old
# run, 1: the new one); killed just before its rename number `kill_at` (or before the marker's removal when that
# is one past the renames); "count" prints how many renames a write makes
CHILD = """
import os, signal, sys, types
from pathlib import Path
import numpy as np, torch
from hkt_nb.lra import loop
from hkt_nb.model import ClassifierConfig, HKTClassifier

results_dir, version, kill_at = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
kill_at = int(kill_at) if kill_at.isdigit() else kill_at
renames, real_replace, real_unlink = [0], os.replace, Path.unlink

def replace(src, dst):
    renames[0] += 1
    if renames[0] == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    return real_replace(src, dst)

def unlink(self, missing_ok=False):
    if self.name.endswith(".replacing") and kill_at == renames[0] + 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return real_unlink(self, missing_ok=missing_ok)

os.replace, Path.unlink = replace, unlink
torch.manual_seed(version)
config = ClassifierConfig(vocab_size=11, n_classes=3, max_len=16, d_model=16, n_heads=2, n_layers=1)
model = HKTClassifier(config)
labels = np.arange(12) % 3
run = types.SimpleNamespace(
    name=sys.argv[4], results_dir=results_dir, model_config=config, train_config=types.SimpleNamespace(save_model=True),
    best={"epoch": 1, "state": model.state_dict()}, splits={"test": {"label": labels}},
    checkpoint_path=results_dir / "checkpoints" / sys.argv[4] / "last.pt", show=lambda message: None)
record = {"run": run.name, "complete": True, "task": "synthetic", "model": "hkt", "preset": "smoke", "seed": 0,
          "test_acc": 0.5 + version / 10, "version": version}
loop.write_outputs(run, record, (labels + version) % 3)
if kill_at == "count":
    print(renames[0])
"""


def child(results_dir: Path, version: int, kill_at, repo_root: Path, run: str = RUN) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CHILD, str(results_dir), str(version), str(kill_at), run],
                          capture_output=True, text=True, cwd=repo_root,
                          env={**os.environ, "PYTHONPATH": str(repo_root), "OMP_NUM_THREADS": "1"})


def what_a_reader_sees(results_dir: Path) -> str:
    """'old' or 'new' when the record, its predictions, its model file and its pretrained folder all belong to
    that run; 'error' when a reader is refused with a message naming the interrupted replacement or the mismatch;
    'mix' otherwise (the failure this test exists for)."""
    from hkt_nb.model import HKTClassifier

    path = results_dir / f"{RUN}.json"
    try:
        record = read_record(path)
        predictions, labels = read_predictions(results_dir / record["predictions_path"], None,
                                               record["written_files"][record["predictions_path"]])
        model_file = check_written_file(results_dir, record, record["model_path"])
    except UnreadableRecordError as error:
        assert "being replaced" in str(error) or "not the file" in str(error), error
        return "error"
    version = record["version"]
    predicted = ((labels + version) % 3 == predictions).all()
    pretrained = HKTClassifier.from_pretrained(results_dir / record["pretrained_path"]).state_dict()
    model = HKTClassifier.from_checkpoint(model_file).state_dict()
    agree = predicted and all((pretrained[k] == model[k]).all() for k in model)
    return {0: "old", 1: "new"}[version] if agree else "mix"


@pytest.mark.slow
def test_a_retrain_killed_at_every_step_leaves_the_old_run_the_new_one_or_a_named_error(tmp_path, repo_root):
    counted = child(tmp_path / "count", 0, "count", repo_root)
    assert counted.returncode == 0, counted.stderr
    renames = int(counted.stdout.split()[-1])
    assert renames >= 5  # the marker, the model, the pretrained folder's files, the predictions, the record
    assert child(tmp_path / "old", 0, "never", repo_root).returncode == 0  # the old run, whole
    assert what_a_reader_sees(tmp_path / "old") == "old"
    seen = {}
    for kill_at in range(1, renames + 2):  # + 1: killed before the marker is removed
        folder = shutil.copytree(tmp_path / "old", tmp_path / f"kill{kill_at}")
        out = child(folder, 1, kill_at, repo_root)
        assert out.returncode == -signal.SIGKILL, out.stderr
        seen[kill_at] = what_a_reader_sees(folder)
    assert seen[1] == "old"  # killed before the marker is in place: nothing was touched
    assert all(state == "error" for k, state in seen.items() if k > 1), seen
    assert child(folder, 1, "never", repo_root).returncode == 0  # a later write clears what the killed one left
    assert what_a_reader_sees(folder) == "new" and not replacing_marker(folder / f"{RUN}.json").exists()
    assert not [p for p in folder.rglob("*") if ".tmp" in p.name]


def test_the_record_names_its_files_with_their_hashes_and_no_marker_remains(tmp_path, repo_root):
    assert child(tmp_path, 1, "never", repo_root).returncode == 0
    record = json.loads((tmp_path / f"{RUN}.json").read_text())
    assert sorted(record["written_files"]) == sorted([record["predictions_path"], record["model_path"]])
    for relative, digest in record["written_files"].items():
        assert digest == file_sha256(tmp_path / relative) and len(digest) == 64
    assert not replacing_marker(tmp_path / f"{RUN}.json").exists()
    assert what_a_reader_sees(tmp_path) == "new"


@pytest.mark.slow
def test_predictions_of_another_run_beside_a_record_are_refused(tmp_path, repo_root):
    "The siblings: a record with predictions or a model file copied from another run of the same shape."
    for version, folder in ((0, tmp_path / "a"), (1, tmp_path / "b")):
        assert child(folder, version, "never", repo_root).returncode == 0
    a, b = tmp_path / "a", tmp_path / "b"
    record = read_record(a / f"{RUN}.json")
    for relative in (record["predictions_path"], record["model_path"]):
        shutil.copyfile(b / relative, a / relative)
        assert what_a_reader_sees(a) == "error"
        with pytest.raises(UnreadableRecordError, match=f"{a / relative}.*not the file"):
            check_written_file(a, record, relative)
        child(a, 0, "never", repo_root)  # rewritten whole: readable again
        assert what_a_reader_sees(a) == "old"


def test_a_marker_refuses_the_record_and_names_itself(tmp_path):
    path = tmp_path / f"{RUN}.json"
    path.write_text(json.dumps({"run": RUN, "complete": False, "task": "t", "model": "m", "preset": "p", "seed": 0}))
    assert read_record(path)["run"] == RUN
    marker = replacing_marker(path)
    assert marker == tmp_path / f".{RUN}.json.replacing"
    marker.write_text("{}")
    with pytest.raises(UnreadableRecordError, match=r"being replaced.*\.replacing is there"):
        read_record(path)


def test_read_predictions_checks_the_hash_only_when_given(tmp_path):
    path = tmp_path / "p.npz"
    save_predictions(path, np.array([1, 0, 2]), np.array([1, 1, 2]))
    assert read_predictions(path, 3)[0].tolist() == [1, 0, 2]  # records of earlier versions carry no hash
    assert read_predictions(path, 3, file_sha256(path))[1].tolist() == [1, 1, 2]
    with pytest.raises(UnreadableRecordError, match="not the file its record was written with"):
        read_predictions(path, 3, "0" * 64)


# --- the training checkpoint: one file, replaced atomically ------------------------------------------------------

CHECKPOINT_CHILD = """
import os, signal, sys, torch
from pathlib import Path
from hkt_nb.train import checkpoints

path, step = Path(sys.argv[1]), sys.argv[2]
real_fsync, real_replace, real_save = os.fsync, os.replace, torch.save

def kill():
    os.kill(os.getpid(), signal.SIGKILL)

def half_written(obj, file):  # killed in the middle of the write: half of the bytes reach the temporary file
    import io
    buffer = io.BytesIO(); real_save(obj, buffer)
    file.write(buffer.getvalue()[: len(buffer.getvalue()) // 2]); file.flush(); kill()

if step == "mid-write":
    torch.save = half_written
elif step == "before-fsync":
    os.fsync = lambda fd: kill()
elif step == "before-rename":
    os.replace = lambda a, b: kill()
elif step == "after-rename":
    os.replace = lambda a, b: (real_replace(a, b), kill())
checkpoints.atomic_save({"epoch": 2, "model": {"w": torch.full((64, 64), 2.0)}}, path)
"""


@pytest.mark.parametrize("step", ["mid-write", "before-fsync", "before-rename", "after-rename", "never"])
def test_a_checkpoint_write_killed_at_any_step_leaves_the_old_checkpoint_or_the_new_one(step, tmp_path, repo_root):
    "The epoch-1 checkpoint is replaced by epoch 2's; killed at any step, `read_checkpoint` gives one of the two, whole."
    import torch

    from hkt_nb.train.checkpoints import atomic_save, read_checkpoint

    path = tmp_path / "checkpoints" / RUN / "last.pt"
    atomic_save({"epoch": 1, "model": {"w": torch.full((64, 64), 1.0)}}, path)
    out = subprocess.run([sys.executable, "-c", CHECKPOINT_CHILD, str(path), step], capture_output=True, text=True,
                         cwd=repo_root, env={**os.environ, "PYTHONPATH": str(repo_root), "OMP_NUM_THREADS": "1"})
    assert out.returncode == (0 if step == "never" else -signal.SIGKILL), out.stderr
    checkpoint = read_checkpoint(path, "cpu")
    expected = 2 if step in ("after-rename", "never") else 1
    assert checkpoint["epoch"] == expected and torch.equal(checkpoint["model"]["w"], torch.full((64, 64), float(expected)))
    # what a killed writer leaves is at most its own hidden temporary file, never a second checkpoint
    assert [p.name for p in path.parent.iterdir() if not p.name.startswith(".")] == ["last.pt"]
