"""Tests of hkt_nb.train.distributed: the device and precision choice, the CUDA fallback, and two processes under
torchrun equal to one."""
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from hkt_nb.train.distributed import ShardSampler, amp_dtype, resolve_device


def test_device_and_precision_choice():
    assert resolve_device("cpu") == torch.device("cpu") and amp_dtype(torch.device("cpu")) is None
    assert amp_dtype(torch.device("cpu"), "off") is None
    if not torch.cuda.is_available():
        with pytest.warns(UserWarning, match="CUDA is not available"):
            assert resolve_device("cuda") == torch.device("cpu")
        assert resolve_device("auto") == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the fallback happens only without CUDA")
def test_cuda_without_cuda_warns_once(tmp_path, capsys, one_thread):
    "`hkt-train --device cuda` on a CPU machine: one warning for the whole run, and no second copy printed."
    from hkt_nb.lra.runs import main
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # count every warning issued, not only the first of its kind
        main(["--task", "synthetic", "--device", "cuda", "--epochs", "1", "--threads", "1", "--no-progress",
              "--results-dir", str(tmp_path)])
    fallback = [w for w in caught if "CUDA is not available" in str(w.message)]
    assert len(fallback) == 1 and fallback[0].category is UserWarning
    assert "CUDA is not available" not in capsys.readouterr().err
    [record] = tmp_path.glob("synthetic-hkt-smoke-x*-seed0.json")  # --epochs 1: a variant of the smoke preset
    assert json.loads(record.read_text())["hardware"]["device"] == "cpu"


@pytest.mark.slow
def test_ddp_two_processes_gloo_matches_single_process(tmp_path, smoke_run):
    """torchrun with 2 CPU processes: each takes half of every batch (DistributedSampler), gradients are averaged,
    so without dropout the run equals the single-process one up to rounding."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
           "-m", "hkt_nb.lra.runs", "--task", "synthetic", "--model", "hkt", "--preset", "smoke", "--seed", "0",
           "--device", "cpu", "--results-dir", str(tmp_path / "results"), "--checkpoint-dir", str(tmp_path / "c"),
           "--no-progress"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    files = list((tmp_path / "results").glob("*.json"))
    assert [f.name for f in files] == ["synthetic-hkt-smoke-seed0.json"]  # written once, by rank 0
    r = json.loads(files[0].read_text())
    assert r["hardware"]["world_size"] == 2 and r["n_test_evaluated"] == 128
    single = smoke_run[1]
    for a, b in zip(r["history"], single["history"]):
        for k in ("train_loss", "val_loss", "val_acc", "lr"):
            assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-6), k
    assert r["test_acc"] == pytest.approx(single["test_acc"], abs=1 / 128)


@pytest.mark.parametrize("device, error", [("tpu", ValueError), ("cuda:x", ValueError), (0, TypeError)])
def test_a_bad_device_names_the_argument(device, error):
    with pytest.raises(error, match="device"):
        resolve_device(device)


@pytest.mark.parametrize("n, world", [(10, 3), (7, 2), (4, 4), (3, 5)])
def test_shards_cover_every_example_once(n, world):
    assert sorted(i for r in range(world) for i in ShardSampler(n, r, world)) == list(range(n))
