"""Tests of the training code's GPU paths that run without a GPU (issue 12): precision choice by compute capability,
execution-only settings, the time budget and the CLI flags. (That the layers and the classifier compile to one graph
is tested with them, in test_attention.py and test_model.py.)"""
import json
from pathlib import Path

import pytest
import torch

import hkt_nb
from hkt_nb import ClassifierConfig, HKTClassifier
from hkt_nb.lra.config import PRESETS, TrainConfig, result_relevant, run_name, run_variant
from hkt_nb.train.distributed import amp_dtype, execution_settings
from hkt_nb.lra.loop import train
from hkt_nb.train.optim import build_optimizer
from hkt_nb.lra.runs import _train_overrides, finished_run, parse_args

ROOT = Path(__file__).resolve().parents[1]
CUDA = torch.device("cuda")


@pytest.fixture
def fake_capability(monkeypatch):
    "Fake `torch.cuda.get_device_capability` (no GPU needed): call with the (major, minor) to report."
    def set_capability(major, minor):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, minor))
    return set_capability


@pytest.mark.parametrize("capability, expected", [((6, 0), torch.float16), ((7, 0), torch.float16),
                                                  ((7, 5), torch.float16), ((8, 0), torch.bfloat16),
                                                  ((8, 9), torch.bfloat16), ((9, 0), torch.bfloat16)])
def test_amp_auto_bf16_only_on_native_hardware(fake_capability, capability, expected):
    fake_capability(*capability)  # P100, V100, T4 (emulated bf16) -> fp16; A100, L4, H100 -> bf16
    assert amp_dtype(CUDA, "auto") == expected
    assert amp_dtype(CUDA, "bf16") == torch.bfloat16 and amp_dtype(CUDA, "fp16") == torch.float16
    assert amp_dtype(CUDA, "off") is None


def test_amp_auto_ignores_emulated_bf16_support(fake_capability, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)  # what a T4 reports
    fake_capability(7, 5)
    assert amp_dtype(CUDA) == torch.float16


def test_amp_on_cpu_unchanged_and_bad_mode_rejected():
    cpu = torch.device("cpu")
    assert amp_dtype(cpu) is None and amp_dtype(cpu, "off") is None
    assert amp_dtype(cpu, "bf16") == torch.bfloat16 and amp_dtype(cpu, "fp16") == torch.float16
    with pytest.raises(ValueError, match="amp must be"):
        amp_dtype(cpu, "fp8")


@pytest.mark.parametrize("dtype, scaled", [(torch.float16, True), (torch.bfloat16, False), (None, False)])
def test_loss_scaling_only_for_float16(dtype, scaled):
    model = HKTClassifier(ClassifierConfig(vocab_size=5, n_classes=2, max_len=8, d_model=8, n_heads=2, n_layers=1))
    _, _, scaler = build_optimizer(model, TrainConfig(), 10, torch.device("cpu"), dtype)
    assert scaler.is_enabled() == scaled


def test_execution_settings_by_device(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 12)
    assert execution_settings(TrainConfig(), torch.device("cpu")) == {"num_workers": 0, "pin_memory": False,
                                                                      "compile": False}
    assert execution_settings(TrainConfig(), CUDA) == {"num_workers": 4, "pin_memory": True, "compile": True}
    assert execution_settings(TrainConfig(), CUDA, world=4)["num_workers"] == 2  # 12 cores / 4 processes - 1
    explicit = TrainConfig(num_workers=1, pin_memory=False, compile=False)
    assert execution_settings(explicit, CUDA) == {"num_workers": 1, "pin_memory": False, "compile": False}
    assert execution_settings(TrainConfig(pin_memory=True), torch.device("cpu"))["pin_memory"] is False
    monkeypatch.setattr("os.cpu_count", lambda: 1)
    assert execution_settings(TrainConfig(), CUDA)["num_workers"] == 1


@pytest.mark.parametrize("field, value", [("num_workers", -1), ("num_workers", True), ("num_workers", 1.5),
                                          ("pin_memory", "yes"), ("compile", 1)])
def test_execution_fields_checked(field, value):
    with pytest.raises(ValueError if value == -1 else TypeError, match=field):  # hkt_nb._checks: type, then value
        TrainConfig(**{field: value})


def test_execution_fields_do_not_make_finished_runs_stale():
    for field in ("num_workers", "pin_memory", "compile"):
        assert field not in result_relevant(TrainConfig())
    records = sorted((ROOT / "results").glob("*-cpu_small-seed0.json"))
    assert records, "the committed cpu_small runs are missing"
    for path in records:
        record = json.loads(path.read_text())
        found = finished_run(record["task"], record["model"], "cpu_small", 0, ROOT / "results")
        assert found is not None and found["test_acc"] == record["test_acc"], path.name


def test_cli_precision_compile_and_budget_flags():
    arguments = parse_args(["--task", "listops", "--amp", "fp16", "--no-compile", "--time-budget", "90"])
    assert _train_overrides(arguments) == {"amp": "fp16", "compile": False} and arguments.time_budget == 90.0
    arguments = parse_args(["--task", "listops", "--compile"])
    assert _train_overrides(arguments) == {"compile": True}
    assert _train_overrides(parse_args(["--task", "listops"])) == {}
    with pytest.raises(SystemExit):
        parse_args(["--task", "listops", "--amp", "fp8"])


SMALL = {"n_train": 128, "n_val": 32, "n_test": 32}


def test_time_budget_stops_cleanly_between_steps(tmp_path):
    record = train("synthetic", "hkt", "smoke", 0, device="cpu", results_dir=tmp_path, progress=False,
                   verbose=False, time_budget_s=0.0, train_overrides=SMALL)
    budget = record["time_budget"]
    assert not record["complete"] and record["history"] == []
    assert budget["epoch"] == 1 and budget["steps_done"] == 0 and budget["examples"] == budget["examples_trained"] == 0
    assert budget["steps_per_epoch"] == -(-record["data"]["n_train"] // PRESETS["smoke"].train.batch_size)
    assert not (tmp_path / f"{record['run']}.json").exists()  # an incomplete run writes no results file


def test_time_budget_before_first_epoch_names_no_checkpoint(tmp_path, capsys):
    "Stopped before any epoch finished: no last.pt exists, so the message must not offer to resume from one."
    record = train("synthetic", "hkt", "smoke", 0, device="cpu", results_dir=tmp_path, progress=False,
                   verbose=True, time_budget_s=0.0, train_overrides=SMALL, checkpoint_dir=tmp_path / "c")
    out = capsys.readouterr().out
    assert record["history"] == [] and not (tmp_path / "c" / "last.pt").exists()
    assert "stopped after epoch 0 of" in out
    assert "no epoch finished, so nothing was checkpointed and the next run starts afresh" in out
    assert "run again to resume" not in out


def test_resume_ignores_execution_only_fields(tmp_path):
    kw = dict(device="cpu", progress=False, verbose=False, results_dir=tmp_path, checkpoint_dir=tmp_path / "c")
    part = train("synthetic", "hkt", "smoke", 0, stop_after=1, train_overrides=SMALL, **kw)
    assert len(part["history"]) == 1
    resumed = train("synthetic", "hkt", "smoke", 0,
                    train_overrides={**SMALL, "num_workers": 0, "pin_memory": False, "compile": False}, **kw)
    assert resumed["complete"] and resumed["history"][0] == part["history"][0]


def test_results_dir_rule(tmp_path, monkeypatch):
    from hkt_nb.lra.runs import default_results_dir
    monkeypatch.delenv("HKT_RESULTS_DIR", raising=False)
    assert default_results_dir(ROOT / "nbs") == ROOT / "results"  # inside a clone: the repository's results/
    outside, drive = tmp_path / "colab", tmp_path / "drive"
    outside.mkdir()
    assert default_results_dir(outside, drive=drive) == outside / "results"  # no Drive: ./results
    drive.mkdir()
    assert default_results_dir(outside, drive=drive) == drive / "hkt_nb" / "results"  # Drive mounted
    monkeypatch.setenv("HKT_RESULTS_DIR", str(tmp_path / "mine"))
    assert default_results_dir(outside, drive=drive) == tmp_path / "mine"


def test_fetch_record_from_the_override_never_the_network(tmp_path, monkeypatch):
    from hkt_nb.lra.runs import fetch_record, records_url
    assert records_url().startswith("https://raw.githubusercontent.com/") and records_url().endswith("/results")
    assert f"/v{hkt_nb.__version__}/results" in records_url()  # the release tag v<version>
    monkeypatch.setenv("HKT_NB_RECORDS", str(ROOT / "results"))
    local = tmp_path / "results"
    path = fetch_record("bench_cost_cpu.json", local)
    assert path == local / "bench_cost_cpu.json" and path.read_bytes() == (ROOT / "results/bench_cost_cpu.json").read_bytes()
    assert fetch_record("bench_cost_cpu.json", local) == path  # already there: no copy
    with pytest.raises(FileNotFoundError, match="no-such-record.json"):
        fetch_record("no-such-record.json", local)


def test_estimated_time_before_training(monkeypatch):
    from hkt_nb.lra.runs import estimated_time
    line = estimated_time("listops", ["hkt", "mha"], "paper", [0, 1, 2], "cpu", ROOT / "results")
    assert line.startswith("estimated time on this CPU: about ") and line.split()[7] == "h" and "6 run(s)" in line
    assert "unknown" in estimated_time("imdb", ["hkt"], "smoke", [0], "cpu", ROOT / "tests")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert "no GPU throughput is recorded" in estimated_time("listops", ["hkt"], "paper", [0], "auto", ROOT / "results")


def test_checkpoints_live_inside_the_results_folder(tmp_path):
    record = train("synthetic", "hkt", "smoke", 0, device="cpu", results_dir=tmp_path / "results", progress=False,
                   verbose=False, stop_after=1, train_overrides=SMALL)
    name = run_name("synthetic", "hkt", "smoke", 0, run_variant({"train": SMALL}))  # smaller splits: a variant
    assert record["run"] == name != "synthetic-hkt-smoke-seed0" and record["checkpoint_dir"] == f"checkpoints/{name}"
    assert (tmp_path / "results" / "checkpoints" / name / "last.pt").exists()
    assert not (tmp_path / "checkpoints").exists()
