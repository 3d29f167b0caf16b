"""Tests of hkt_nb.train.checkpoints: exact resumption (after an interruption and after SIGKILL), a checkpoint of
another configuration or a damaged one refused with a clear message, folders checked before any work."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hkt_nb.lra import loop
from hkt_nb.lra.config import run_name, run_variant
from hkt_nb.lra.loop import _comparable, train
from hkt_nb.train.checkpoints import (
    RunLockedError,
    atomic_save,
    rng_state,
    run_lock,
    seed_everything,
    set_rng_state,
)

QUIET = dict(device="cpu", progress=False, verbose=False)
TIMING = ("train_time_s", "train_examples_per_s")


def untimed(history):
    return [{k: v for k, v in h.items() if k not in TIMING} for h in history]


def test_resume_after_interruption_equals_uninterrupted(tmp_path, one_thread):
    kw = dict(device="cpu", progress=False, verbose=False, model_overrides={"dropout": 0.1},  # dropout: RNG matters
              train_overrides={"epochs": 3, "n_train": 128, "n_val": 64, "n_test": 64, "save_model": True})
    full = train("synthetic", "hkt", "smoke", 3, results_dir=tmp_path / "a", checkpoint_dir=tmp_path / "ca", **kw)
    part = train("synthetic", "hkt", "smoke", 3, results_dir=tmp_path / "b", checkpoint_dir=tmp_path / "cb",
                 stop_after=1, **kw)
    assert not part["complete"] and len(part["history"]) == 1 and (tmp_path / "cb" / "last.pt").exists()
    assert not (tmp_path / "b" / f"{part['run']}.json").exists()  # no results file for an unfinished run
    resumed = train("synthetic", "hkt", "smoke", 3, results_dir=tmp_path / "b", checkpoint_dir=tmp_path / "cb", **kw)
    assert resumed["complete"] and untimed(resumed["history"]) == untimed(full["history"])
    assert resumed["test_acc"] == full["test_acc"] and resumed["lambdas"] == full["lambdas"]
    a = torch.load(tmp_path / "a" / full["model_path"], weights_only=True)["state_dict"]
    b = torch.load(tmp_path / "b" / resumed["model_path"], weights_only=True)["state_dict"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resume_refuses_a_different_configuration(tmp_path, one_thread):
    kw = dict(device="cpu", progress=False, verbose=False, results_dir=tmp_path, checkpoint_dir=tmp_path / "c",
              train_overrides={"n_train": 64, "n_val": 32, "n_test": 32})
    train("synthetic", "hkt", "smoke", 0, stop_after=1, **kw)
    with pytest.raises(ValueError, match="different configuration") as error:
        train("synthetic", "hkt", "smoke", 0, model_overrides={"d_model": 16}, **kw)
    assert "--checkpoint-dir" in str(error.value) and "--no-resume" not in str(error.value)  # never overwrite it
    r = train("synthetic", "hkt", "smoke", 0, model_overrides={"d_model": 16}, resume=False, **kw)
    assert r["complete"] and r["config"]["model"]["d_model"] == 16


@pytest.mark.parametrize("option", ["results_dir", "checkpoint_dir"])
def test_unwritable_folder_fails_before_training(tmp_path, option):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    folders = {"results_dir": tmp_path / "r", "checkpoint_dir": tmp_path / "c", option: blocker / "sub"}
    with pytest.raises(ValueError, match=f"{option} .*a-file"):
        train("synthetic", **folders, **QUIET)
    assert not (tmp_path / "r").exists() or not list((tmp_path / "r").iterdir())


def test_a_checkpoint_of_another_results_version_is_not_continued(tmp_path):
    "A checkpoint written before results version 2 (its best model chosen by accuracy) is refused, saying so."
    kw = dict(results_dir=tmp_path / "r", checkpoint_dir=tmp_path / "c", **QUIET,
              train_overrides={"n_train": 32, "n_val": 16, "n_test": 16})
    train("synthetic", stop_after=1, **kw)
    checkpoint = torch.load(tmp_path / "c" / "last.pt", weights_only=True)
    del checkpoint["fingerprint"]["results_version"]  # as version 1 wrote it
    checkpoint["best"].pop("val_loss")
    torch.save(checkpoint, tmp_path / "c" / "last.pt")
    with pytest.raises(ValueError, match="results version 1 .*--no-resume"):
        train("synthetic", **kw)
    assert train("synthetic", resume=False, **kw)["complete"]


def test_the_checkpoint_format_is_the_one_earlier_versions_wrote(tmp_path):
    """The per-epoch checkpoint keeps the keys and fingerprint fields that the code before the training core
    (`hkt_nb.train`, issue 31) wrote, and holds only plain data (loaded with weights_only=True): a run interrupted
    under the earlier code resumes under this one (checked by hand on a listops smoke run, with identical records)."""
    kw = dict(results_dir=tmp_path / "r", checkpoint_dir=tmp_path / "c", **QUIET,
              train_overrides={"n_train": 32, "n_val": 16, "n_test": 16})
    train("synthetic", stop_after=1, **kw)
    checkpoint = torch.load(tmp_path / "c" / "last.pt", weights_only=True)
    assert set(checkpoint) == {"fingerprint", "epoch", "model", "optimizer", "scheduler", "scaler", "rng", "history",
                               "best", "train_time_s", "train_examples"}
    assert set(checkpoint["fingerprint"]) == {"task", "model", "preset", "seed", "results_version", "world_size",
                                              "model_config", "train_config", "n"}
    assert checkpoint["epoch"] == 1 and set(checkpoint["rng"][0]) >= {"python", "numpy", "torch"}
    assert train("synthetic", **kw)["complete"]


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_damaged_checkpoint_names_the_file_and_the_way_out(tmp_path, damage):
    kw = dict(results_dir=tmp_path / "r", checkpoint_dir=tmp_path / "c", **QUIET,
              train_overrides={"n_train": 32, "n_val": 16, "n_test": 16})
    train("synthetic", stop_after=1, **kw)
    checkpoint = tmp_path / "c" / "last.pt"
    data = checkpoint.read_bytes()
    checkpoint.write_bytes({"truncate": data[: len(data) // 2], "garbage": b"x" * 100, "empty": b""}[damage])
    with pytest.raises(RuntimeError, match="last.pt") as error:
        train("synthetic", **kw)
    assert "--no-resume" in str(error.value) and "weights_only=False" not in str(error.value)
    assert train("synthetic", resume=False, **kw)["complete"]


@pytest.mark.slow
def test_resume_after_sigkill_loses_no_finished_epoch(tmp_path, one_thread):
    """A real kill: SIGKILL the CLI once its first epoch is checkpointed, rerun the same command, and compare
    with an uninterrupted run (same seed, one thread): every epoch's metrics and the test accuracy agree."""
    import signal
    import time

    epochs = 12
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    cmd = [sys.executable, "-m", "hkt_nb.lra.runs", "--task", "synthetic", "--model", "hkt", "--preset", "smoke",
           "--seed", "5", "--device", "cpu", "--epochs", str(epochs), "--threads", "1", "--no-progress",
           "--results-dir", str(tmp_path / "r"), "--checkpoint-dir", str(tmp_path / "c")]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ckpt, deadline = tmp_path / "c" / "last.pt", time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if ckpt.exists() and torch.load(ckpt, weights_only=True)["epoch"] >= 1:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    assert proc.wait(timeout=60) == -signal.SIGKILL, "the run ended before it could be killed"
    killed_at = torch.load(ckpt, weights_only=True)["epoch"]
    assert 1 <= killed_at < epochs and not list((tmp_path / "r").glob("*.json"))  # killed mid-run: no results yet
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"resumed from {ckpt} after epoch {killed_at}" in out.stdout
    name = run_name("synthetic", "hkt", "smoke", 5, run_variant({"train": {"epochs": epochs}}))  # --epochs: a variant
    resumed = json.loads((tmp_path / "r" / f"{name}.json").read_text())
    full = train("synthetic", "hkt", "smoke", 5, device="cpu", epochs=epochs, progress=False, verbose=False,
                 results_dir=tmp_path / "full", checkpoint_dir=tmp_path / "cf")
    assert len(resumed["history"]) == epochs
    for a, b in zip(resumed["history"], full["history"]):
        for k in ("train_loss", "val_loss", "val_acc", "lr"):
            assert a[k] == pytest.approx(b[k], rel=1e-6, abs=1e-9), (a["epoch"], k)
    assert resumed["test_acc"] == full["test_acc"]



def test_random_states_round_trip_and_checkpoints_write_atomically(tmp_path):
    seed_everything(3)
    state = rng_state()
    first = torch.rand(3)
    set_rng_state(state)
    assert torch.equal(torch.rand(3), first)
    atomic_save({"a": 1}, tmp_path / "x.json")
    assert json.loads((tmp_path / "x.json").read_text()) == {"a": 1} and not list(tmp_path.glob("*tmp*"))


def test_a_checkpoint_of_the_flat_model_config_still_resumes():
    "A fingerprint written before the variant registry (flat n_levels, ...) compares equal to today's."
    flat = {"vocab_size": 5, "n_classes": 4, "max_len": 64, "d_model": 32, "n_heads": 2, "n_layers": 1, "d_ff": 128,
            "dropout": 0.0, "attn_dropout": 0.0, "attention": "hkt", "n_levels": 3, "stride": 2, "kernel_size": None,
            "conv_kernel_size": 3, "causal": False}
    nested = {**{k: v for k, v in flat.items() if k not in ("n_levels", "stride", "kernel_size", "conv_kernel_size")},
              "attention_params": {"n_levels": 3, "stride": 2, "kernel_size": None, "conv_kernel_size": 3}}
    assert _comparable({"model_config": flat, "train_config": {"num_workers": 2}}) == \
        _comparable({"model_config": nested, "train_config": {}})


# ---------------------------------------------------------------- concurrent writers and the per-run lock (issue 20)
ROOT = Path(__file__).resolve().parents[1]
WRITER = """
import sys, time
from pathlib import Path
import torch
from hkt_nb.train.checkpoints import atomic_save
k, folder, n = int(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
(folder / f"ready{k}").touch()
while not (folder / "go").exists():
    time.sleep(0.001)
for i in range(n):
    value = 1000 * k + i
    atomic_save({"writer": k, "i": i, "payload": torch.full((100_000,), float(value))}, folder / "last.pt")
    atomic_save({"writer": k, "i": i, "payload": [value] * 2000}, folder / "record.json")
"""


def _python(code: str, *args, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], env=env, **kwargs)


def test_two_processes_saving_one_path_never_leave_a_partial_or_mixed_file(tmp_path):
    """Two writers `atomic_save` the same checkpoint and JSON 60 times each while this process reads them: no writer
    fails, and every read is one complete write (its payload all of one writer's value), never a partial file or a
    mixture (the fixed `<path>.tmp` of old raised FileNotFoundError and left unreadable files)."""
    writers = [_python(WRITER, k, tmp_path, 60, stderr=subprocess.PIPE) for k in (1, 2)]
    while not all((tmp_path / f"ready{k}").exists() for k in (1, 2)):
        assert all(w.poll() is None for w in writers), [w.stderr.read().decode()[-2000:] for w in writers]
        time.sleep(0.01)
    (tmp_path / "go").touch()
    reads = 0
    while any(w.poll() is None for w in writers):
        if (tmp_path / "last.pt").exists():
            state = torch.load(tmp_path / "last.pt", weights_only=True)
            assert torch.equal(state["payload"], torch.full((100_000,), float(1000 * state["writer"] + state["i"])))
            reads += 1
        if (tmp_path / "record.json").exists():
            record = json.loads((tmp_path / "record.json").read_text())
            assert record["payload"] == [1000 * record["writer"] + record["i"]] * 2000
            reads += 1
    for w in writers:
        assert w.wait() == 0, w.stderr.read().decode()[-3000:]
    assert reads > 0
    assert torch.load(tmp_path / "last.pt", weights_only=True)["i"] == 59
    leftovers = sorted(p.name for p in tmp_path.iterdir())
    assert leftovers == ["go", "last.pt", "ready1", "ready2", "record.json"], leftovers  # no temporary file left


SMALL = dict(device="cpu", progress=False, verbose=False, train_overrides={"n_train": 32, "n_val": 16, "n_test": 16})


def _lock_of_small_run(results_dir: Path) -> Path:
    "Where `train('synthetic', **SMALL)` (a variant of smoke: its own name) holds its lock."
    from hkt_nb.lra.config import RunSpec, run_identity
    name, _ = run_identity(RunSpec("synthetic", train_overrides=SMALL["train_overrides"]).resolved())
    return results_dir / "checkpoints" / f"{name}.lock"


def test_a_second_live_run_of_the_same_name_is_refused(tmp_path, monkeypatch):
    """While a run trains, a second `train` of the same run and results folder fails with RunLockedError naming the
    lock file and the process that holds it; the first run is not disturbed, and releases the lock when it ends."""
    lock = _lock_of_small_run(tmp_path)
    inner = {}
    real_epoch = loop.train_one_epoch

    def epoch_that_starts_a_second_run(run, epoch):
        assert lock.read_text().strip() == str(os.getpid())
        with pytest.raises(RunLockedError) as error:
            loop.train("synthetic", results_dir=tmp_path, checkpoint_dir=tmp_path / "other", **SMALL)
        inner["message"] = str(error.value)
        return real_epoch(run, epoch)

    monkeypatch.setattr(loop, "train_one_epoch", epoch_that_starts_a_second_run)
    record = loop.train("synthetic", results_dir=tmp_path, **SMALL)
    assert record["complete"] and (tmp_path / f"{record['run']}.json").is_file() and lock.stem == record["run"]
    assert str(lock) in inner["message"] and f"pid {os.getpid()}" in inner["message"]
    assert not lock.exists() and not (tmp_path / "other").exists()  # refused before it created anything


HOLDER = """
import sys, time
from hkt_nb.train.checkpoints import run_lock
with run_lock(sys.argv[1], "the run"):
    print("locked", flush=True)
    time.sleep(120)
"""


def test_a_lock_held_by_another_process_names_it_and_a_killed_ones_is_taken_over(tmp_path):
    """Another live process holds the run's lock: `train` refuses, naming its pid (and `hkt-train` exits with that
    message). Once that process is killed (SIGKILL: no cleanup), its lock file stays behind but no longer blocks."""
    import signal

    from hkt_nb.lra.runs import main

    lock = _lock_of_small_run(tmp_path)
    holder = _python(HOLDER, lock, stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().decode().strip() == "locked"
        with pytest.raises(RunLockedError, match=f"pid {holder.pid}.*{lock}"):
            loop.train("synthetic", results_dir=tmp_path, **SMALL)
        cli_lock = _python(HOLDER, tmp_path / "checkpoints" / "synthetic-hkt-smoke-seed0.lock", stdout=subprocess.PIPE)
        try:  # the CLI's run (the preset's own name) while another process holds its lock: one line, status != 0
            assert cli_lock.stdout.readline().decode().strip() == "locked"
            with pytest.raises(SystemExit) as exit_:
                main(["--task", "synthetic", "--device", "cpu", "--results-dir", str(tmp_path), "--no-progress"])
            assert f"pid {cli_lock.pid}" in str(exit_.value.code) and "synthetic-hkt-smoke-seed0.lock" in str(exit_.value.code)
        finally:
            cli_lock.kill(), cli_lock.wait()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert lock.read_text().strip() == str(holder.pid)  # left behind by the killed process
    assert loop.train("synthetic", results_dir=tmp_path, **SMALL)["complete"]
    assert not lock.exists()
    with run_lock(lock, "x"):  # and the lock can be taken again
        pass
