"""Every failing input of the hardening issue for hkt_nb.lra, each with its siblings: batch lengths, truncation,
argument types, folders checked at start, damaged checkpoints, CLI values, user paths, papermill parameters,
prefix consistency, side effects, the paper-preset warning; and the pins that keep committed runs valid."""
import hashlib
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import datasets
import numpy as np
import pytest

from hkt_nb.lra import benchmarks, listops
from hkt_nb.lra.benchmarks import (
    batch_length,
    cache_dir,
    load_benchmark,
    load_task,
    make_dataloader,
    resolve_data_dir,
    synthetic_benchmark,
)
from hkt_nb.lra.config import TASKS, TrainConfig, get_preset, preset_differences, run_name, run_variant
from hkt_nb.lra.loop import RunSpec, run_identity, train
from hkt_nb.lra.results import load_runs
from hkt_nb.lra.runs import (
    check_experiment_parameters,
    estimated_time,
    finished_run,
    load_or_train,
    main,
    parse_args,
)

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("HKT_DATA_DIR") or REPO.parent / "shared" / "data")
needs_data = pytest.mark.skipif(not (DATA / "imdb").is_dir(), reason="real IMDB / CIFAR-10 data not available")
QUIET = dict(device="cpu", progress=False, verbose=False)


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HKT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


# ---------------------------------------------------------------- 1. batches never exceed the sequence length
@pytest.mark.parametrize("seq_len", [64, 100, 500, 512, 1000, 1024, 2000, 3072])
def test_batch_length_never_exceeds_max_length(seq_len):
    for longest in sorted({1, seq_len // 3, seq_len - 14, seq_len - 1, seq_len}):
        length = batch_length(longest, 64, seq_len)
        assert longest <= length <= seq_len
        assert length == min(-(-longest // 64) * 64, seq_len)


def test_dataloader_caps_a_1986_token_batch_at_2000():
    "The quoted case: ListOps in LRA's setting (T 2000), a batch holding a 1,986-token expression."
    split = datasets.Dataset.from_dict({"input_ids": [[1] * 1986, [2] * 30], "label": [0, 1]})
    assert next(iter(make_dataloader(split, 2, max_length=2000)))[0].shape == (2, 2000)
    assert next(iter(make_dataloader(split, 2)))[0].shape == (2, 1986)  # default: the split's longest
    assert next(iter(make_dataloader(split.select([1]), 1)))[0].shape == (1, 30)


@needs_data
@pytest.mark.parametrize("task, seq_len", [("imdb", 1000), ("imdb", 700), ("scifar10", 1000), ("listops", 600)])
def test_real_batches_fit_every_task_and_seq_len(task, seq_len, tmp_cache):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        split = load_benchmark(task, seq_len=seq_len, max_examples=48, data_dir=DATA)["train"]
    for input_ids, _, _ in make_dataloader(split, 16):
        assert input_ids.shape[1] <= seq_len


# ---------------------------------------------------------------- 2. truncation: refuse for ListOps, warn otherwise
@pytest.mark.parametrize("setting, seq_len", [("paper", 256), ("paper", 511), ("lra", 512), ("lra", 1998)])
def test_listops_refuses_a_seq_len_that_cuts_expressions(setting, seq_len, tmp_cache):
    with pytest.raises(ValueError, match=f"seq_len={seq_len}"):
        load_benchmark("listops", setting=setting, seq_len=seq_len, max_examples=2)


@needs_data
def test_text_and_images_warn_with_the_fraction_truncated(tmp_cache):
    with pytest.warns(UserWarning, match=r"imdb: \d+\.\d % of the reviews .* seq_len=256"):
        load_benchmark("imdb", seq_len=256, max_examples=20, data_dir=DATA)
    with pytest.warns(UserWarning, match=r"scifar10: 100\.0 % of the images"):
        load_benchmark("scifar10", seq_len=512, max_examples=4, data_dir=DATA)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_benchmark("scifar10", max_examples=4, data_dir=DATA)  # full images: nothing cut, no warning


# ---------------------------------------------------------------- 6. types, before any work
@pytest.mark.parametrize("argument, value, error", [
    ("seq_len", "512", TypeError), ("seq_len", 512.0, TypeError), ("seq_len", True, TypeError),
    ("seq_len", 0, ValueError), ("n_train", "10", TypeError), ("n_test", -1, ValueError),
    ("max_examples", 2.5, TypeError), ("max_examples", {"train": "3"}, TypeError)])
@pytest.mark.parametrize("task", TASKS)
def test_load_benchmark_argument_types(task, argument, value, error, tmp_cache):
    with pytest.raises(error, match=argument):
        load_benchmark(task, **{argument: value})


def test_train_names_a_missing_split(tmp_path):
    toy = synthetic_benchmark(n_train=16, n_val=8, n_test=8, seq_len=16)
    for missing in ("validation", "test", "train"):
        partial = datasets.DatasetDict({k: v for k, v in toy.items() if k != missing})
        with pytest.raises(ValueError, match=f"lacks the split.*{missing}"):
            train("synthetic", dataset=partial, results_dir=tmp_path / "r", **QUIET)


def test_train_config_rejects_bad_types():
    for field, value in (("epochs", 0), ("epochs", "2"), ("batch_size", 2.0), ("n_train", 0), ("n_val", "5")):
        with pytest.raises(ValueError, match=field):
            TrainConfig(**{field: value})


# ---------------------------------------------------------------- 7. unwritable folders, checked at start
@pytest.mark.parametrize("option", ["results_dir", "checkpoint_dir"])
def test_unwritable_folder_fails_before_training(tmp_path, option):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    folders = {"results_dir": tmp_path / "r", "checkpoint_dir": tmp_path / "c", option: blocker / "sub"}
    with pytest.raises(ValueError, match=f"{'results' if option == 'results_dir' else 'checkpoint'} folder .*a-file"):
        train("synthetic", **folders, **QUIET)
    assert not (tmp_path / "r").exists() or not list((tmp_path / "r").iterdir())


# ---------------------------------------------------------------- 8. a damaged checkpoint
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


# ---------------------------------------------------------------- 9. zero is not "unset"
@pytest.mark.parametrize("argument, message", [
    (["--epochs", "0"], "must be >= 1, got 0"), (["--epochs", "-2"], "must be >= 1, got -2"),
    (["--threads", "0"], "must be >= 1, got 0"), (["--seed", "-1"], "must be >= 0, got -1"),
    (["--epochs", "two"], "expected an integer >= 1, got 'two'"), (["--seed", "1.5"], "expected an integer >= 0, got '1.5'"),
    (["--device", "tpu"], "expected \"auto\", \"cpu\" or \"cuda[:k]\", got 'tpu'")])
def test_cli_rejects_values_instead_of_ignoring_them(argument, message, capsys):
    with pytest.raises(SystemExit) as exit:
        parse_args(["--task", "listops", *argument])
    error = capsys.readouterr().err
    assert exit.value.code == 2 and f"argument {argument[0]}: {message}" in error, error


def test_cli_honours_every_value():
    arguments = parse_args(["--task", "listops", "--epochs", "1", "--threads", "1", "--seed", "0"])
    assert (arguments.epochs, arguments.threads, arguments.seed) == (1, 1, 0)
    assert parse_args(["--task", "listops"]).epochs is None


def test_epochs_given_to_train_is_honoured(tmp_path):
    record = train("synthetic", epochs=1, results_dir=tmp_path, **QUIET,
                   train_overrides={"n_train": 32, "n_val": 16, "n_test": 16})
    assert len(record["history"]) == 1 and record["config"]["train"]["epochs"] == 1


# ---------------------------------------------------------------- 10. paths relative to where the user stood
@pytest.mark.parametrize("variable, resolve", [("HKT_DATA_DIR", resolve_data_dir), ("HKT_CACHE_DIR", cache_dir)])
def test_environment_paths_resolve_against_the_users_directory(tmp_path, monkeypatch, variable, resolve):
    user_dir, notebook_dir = tmp_path / "repo", tmp_path / "repo" / "nbs"
    notebook_dir.mkdir(parents=True)
    monkeypatch.setenv("PWD", str(user_dir))
    monkeypatch.chdir(notebook_dir)  # a notebook runner moves the kernel into nbs/
    monkeypatch.setenv(variable, "data")
    assert resolve() == user_dir / "data"


def test_argument_paths_resolve_against_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PWD", "/")
    assert resolve_data_dir("data") == tmp_path / "data" and cache_dir("c") == tmp_path / "c"


# ---------------------------------------------------------------- 11. papermill parameters
GOOD = dict(task="listops", models=["hkt", "mha"], preset="smoke", seeds=[0], device="auto", data_dir=None,
            results_dir="results", retrain=False)


@pytest.mark.parametrize("name, text, expected", [
    ("seeds", "[0, 1]", [0, 1]), ("seeds", "0,1", [0, 1]), ("seeds", 3, [3]),
    ("models", "['hkt', 'mha']", ["hkt", "mha"]), ("models", "mha", ["mha"])])
def test_parameters_accept_lists_as_papermill_passes_them(name, text, expected):
    assert check_experiment_parameters(**{**GOOD, name: text})[name] == expected


@pytest.mark.parametrize("name, value", [
    ("task", "mnist"), ("models", ["rnn"]), ("models", []), ("preset", "huge"), ("seeds", "[0, 'a']"),
    ("seeds", [-1]), ("seeds", "zero"), ("device", "tpu"), ("retrain", "yes"), ("results_dir", 3)])
def test_bad_parameters_name_the_parameter(name, value):
    with pytest.raises((TypeError, ValueError), match=name):
        check_experiment_parameters(**{**GOOD, name: value})


def test_seeds_none_means_the_presets_seeds():
    for preset in ("smoke", "cpu", "paper"):
        assert check_experiment_parameters(**{**GOOD, "preset": preset, "seeds": None})["seeds"] == list(
            get_preset(preset).seeds)


@pytest.mark.parametrize("chapter", ["06_listops", "07_scifar10", "08_imdb"])
def test_papermill_lists_every_parameter(chapter):
    papermill = Path(sys.executable).with_name("papermill")
    out = subprocess.run([str(papermill), "--help-notebook", str(REPO / "nbs" / f"{chapter}.ipynb")],
                         capture_output=True, text=True, timeout=120)
    notebook = json.loads((REPO / "nbs" / f"{chapter}.ipynb").read_text())
    cell = next(c for c in notebook["cells"] if "parameters" in c["metadata"].get("tags", []))
    names = [line.split("=")[0].strip() for line in "".join(cell["source"]).splitlines() if "=" in line]
    assert names == ["models", "preset", "seeds", "device", "data_dir", "results_dir", "retrain"]
    for name in names:
        assert f"  {name}:" in out.stdout, (name, out.stdout)


# ---------------------------------------------------------------- 13. prefix consistency in every setting
@pytest.mark.parametrize("window", [
    dict(min_length=3, max_length=5, max_depth=2, max_args=2),    # 400 possible trees: many duplicates
    dict(min_length=2, max_length=6, max_depth=2, max_args=3),
    dict(min_length=4, max_length=12, max_depth=3, max_args=3)])
@pytest.mark.parametrize("chunk_size", [7, 50])
def test_make_listops_is_prefix_consistent_with_duplicates(window, chunk_size):
    longest = listops.make_listops(160, **window, chunk_size=chunk_size, num_proc=1)["Source"]
    for n in (1, 13, 81, 159):
        assert listops.make_listops(n, **window, chunk_size=chunk_size, num_proc=1)["Source"] == longest[:n]
    assert len(set(longest)) == len(longest)


# ---------------------------------------------------------------- 14. no side effects, no machine paths
def test_importing_the_lra_modules_changes_no_global_state():
    "Our modules change no warnings filter (torch, datasets and tqdm install their own: imported first)."
    code = ("import warnings, torch, torch.distributed, datasets, numpy, tqdm, pyarrow, PIL.Image, hkt_nb.model; "
            "before = list(warnings.filters); import hkt_nb.lra.runs, hkt_nb.lra.benchmarks, hkt_nb.lra.tokenize; "
            "assert warnings.filters == before, 'warnings filters changed on import'")
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)


def test_records_hold_no_absolute_paths(tmp_path):
    record = train("synthetic", results_dir=tmp_path / "r", **QUIET, train_overrides={"save_model": True})
    stored = json.loads((tmp_path / "r" / f"{record['run']}.json").read_text())
    for key in ("checkpoint_dir", "model_path", "predictions_path"):
        assert not Path(stored[key]).is_absolute() and str(tmp_path) not in stored[key]


# ---------------------------------------------------------------- 15. the paper preset on a CPU
@pytest.mark.parametrize("task", TASKS)
def test_paper_preset_on_cpu_warns_with_an_estimate(task):
    with pytest.warns(UserWarning, match=r"would take about [\d,]+ hours") as caught:
        line = estimated_time(task, ["hkt", "mha"], "paper", [0, 1, 2], "cpu", REPO / "results")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        estimated_time(task, ["hkt"], "cpu", [0], "cpu", REPO / "results")
    # the warning and the printed line carry the same estimate (one computation)
    hours = re.search(r"would take about ([\d,]+) hours", str(caught[0].message)).group(1)
    assert f"about {hours} h for 6 run(s)" in line


# ---------------------------------------------------------------- pins: committed runs stay valid
#: sha256 (first 16 hex digits) of the first 64 rows (token ids as uint16, then the label) of every split of the
#: cpu preset, and the split sizes, measured with the code that produced the committed runs.
CPU_PRESET_PINS = {
    "listops/train": (6000, "ba9909ce966d6026"), "listops/validation": (1000, "bc4f1ba92ffacf7d"),
    "listops/test": (2000, "65d6f136d8320837"), "imdb/train": (2500, "51952290665c4738"),
    "imdb/validation": (1000, "12e2591628315373"), "imdb/test": (2000, "b4d5b04034240a7e"),
    "scifar10/train": (2500, "b0240746c565061d"), "scifar10/validation": (1000, "aa4a2cfe2542984f"),
    "scifar10/test": (2000, "085b96dd24e19fb3")}


@needs_data
@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS)
def test_cpu_preset_splits_are_byte_identical(task):
    "Uses the shared cache when set (as the runs do); a fresh cache regenerates and must give the same bytes."
    train_config = get_preset("cpu").train_config(task)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dataset_dict = load_task(task, DATA, caps=train_config.caps(), seed=train_config.data_seed)
    for split in ("train", "validation", "test"):
        digest = hashlib.sha256()
        for row in dataset_dict[split].select(range(64)):
            digest.update(np.asarray(row["input_ids"], np.uint16).tobytes()); digest.update(str(row["label"]).encode())
        assert (len(dataset_dict[split]), digest.hexdigest()[:16]) == CPU_PRESET_PINS[f"{task}/{split}"]


def test_cpu_listops_generation_is_pinned():
    "The generator itself (no cache): the first rows of the cpu preset's ListOps test stream."
    params = {k: listops.LISTOPS_SETTINGS["paper"][k] for k in ("min_length", "max_length", "max_depth", "max_args")}
    rows = listops.make_listops(64, **params, seed=0, stream=2, num_proc=1)
    tokens = benchmarks._tok_listops({"Source": rows["Source"], "Target": rows["Target"]}, 512)
    digest = hashlib.sha256()
    for ids, label in zip(tokens["input_ids"], tokens["label"]):
        digest.update(np.asarray(ids, np.uint16).tobytes()); digest.update(str(label).encode())
    assert digest.hexdigest()[:16] == CPU_PRESET_PINS["listops/test"][1]


@pytest.mark.parametrize("path", sorted((REPO / "results").glob("*-cpu-seed0.json")), ids=lambda p: p.stem)
def test_finished_run_accepts_the_committed_records(path):
    record = json.loads(path.read_text())
    found = finished_run(record["task"], record["model"], "cpu", 0, REPO / "results")
    assert found is not None and found["test_acc"] == record["test_acc"]


def test_execution_only_fields_never_make_a_run_stale(tmp_path):
    source = REPO / "results" / "listops-hkt-cpu-seed0.json"
    if not source.is_file():
        pytest.skip("no committed cpu run")
    record = json.loads(source.read_text())
    record["config"]["train"]["num_workers"] = 4  # execution only
    (tmp_path / source.name).write_text(json.dumps(record))
    assert finished_run("listops", "hkt", "cpu", 0, tmp_path) is not None
    record["config"]["train"]["lr"] = 0.5  # result-relevant
    (tmp_path / source.name).write_text(json.dumps(record))
    assert finished_run("listops", "hkt", "cpu", 0, tmp_path) is None


@pytest.mark.parametrize("argument", ["n_examples", "min_length", "max_length", "max_depth", "max_args"])
def test_make_listops_names_a_non_integer_argument(argument):
    arguments = dict(n_examples=3, min_length=3, max_length=9, max_depth=3, max_args=3)
    arguments[argument] = str(arguments[argument])
    with pytest.raises(TypeError, match=argument):
        listops.make_listops(arguments.pop("n_examples"), **arguments, num_proc=1)


# ---------------------------------------------------------------- 16. a modified run never takes its preset's name
def test_variant_name_is_stable_and_follows_the_differences():
    cpu = get_preset("cpu")
    name, differences = run_identity(RunSpec("listops", "hkt", "cpu", 0, epochs=1))
    assert differences == {"train": {"epochs": 1}}
    text = json.dumps(differences, sort_keys=True, separators=(",", ":"))
    variant = "x" + hashlib.sha1(text.encode()).hexdigest()[:6]
    assert variant == "x240573" and run_variant(differences) == variant  # the same in every process and machine
    assert name == run_name("listops", "hkt", "cpu", 0, variant) == "listops-hkt-cpu-x240573-seed0"
    assert run_identity(RunSpec("listops", "hkt", "cpu", 0, epochs=1)) == (name, differences)  # stable across calls
    others = [RunSpec("listops", "hkt", "cpu", 0, epochs=2), RunSpec("listops", "hkt", "cpu", 1, epochs=1),
              RunSpec("listops", "hkt", "cpu", 0, train_overrides={"n_train": 64}),
              RunSpec("listops", "hkt", "cpu", 0, epochs=1, train_overrides={"lr": 5e-4}),
              RunSpec("listops", "mha", "cpu", 0, epochs=1), RunSpec("listops", "hkt", "cpu", 0, model_overrides={"d_model": 32}),
              RunSpec("listops", "hkt", "cpu", 0, dataset=synthetic_benchmark(n_train=16, n_val=8, n_test=8, seq_len=16))]
    names = [run_identity(spec)[0] for spec in others]
    assert len(set(names + [name])) == len(others) + 1 and all("-cpu-x" in n for n in names)
    assert run_identity(others[5])[1] == {"model": {"d_model": 32, "d_ff": 128}}  # with the derived MLP width
    assert run_identity(others[6])[1] == {"dataset": {"train": 16, "validation": 8, "test": 8}}
    assert preset_differences("listops", cpu, cpu.train_config("listops")) == {} and run_variant({}) is None


@pytest.mark.parametrize("spec", [
    RunSpec("listops", "hkt", "cpu", 0),
    RunSpec("listops", "hkt", "cpu", 0, train_overrides={"compile": False, "num_workers": 0, "pin_memory": True}),
    RunSpec("listops", "hkt", "cpu", 0, train_overrides={"compile": True, "num_workers": 4}),
    RunSpec("listops", "hkt", "cpu", 0, epochs=5, train_overrides={"amp": "auto", "n_train": 6000}),  # the preset's
    RunSpec("listops", "hkt", "cpu", 0, model_overrides={"dropout": 0.1, "d_model": 64})],  # own values
    ids=["plain", "execution-only", "compile-workers", "preset-values", "preset-model"])
def test_a_run_that_computes_what_the_preset_says_keeps_its_name(spec):
    assert run_identity(spec) == ("listops-hkt-cpu-seed0", {})


def test_cli_epochs_1_never_overwrites_the_preset_run(tmp_path, capsys, one_thread):
    """`hkt-train --epochs 1` under the cpu preset (on the small synthetic task): the preset's record, predictions
    and model are left as they were, the shortened run is written under its variant name with its differences, and
    neither `finished_run`, `load_or_train` nor `load_runs(..., preset=...)` takes it for a run of the preset."""
    committed = REPO / "results" / "listops-hkt-cpu-seed0.json"
    if committed.is_file():  # a real committed record in the same folder must be untouched and still counted
        (tmp_path / committed.name).write_bytes(committed.read_bytes())
    preset_run = train("synthetic", "hkt", "cpu", 0, results_dir=tmp_path, **QUIET,
                       train_overrides={"compile": False, "num_workers": 0})  # execution only: still the preset's run
    assert preset_run["run"] == "synthetic-hkt-cpu-seed0" and preset_run["variant"] is None
    assert preset_run["overrides"] == {} and len(preset_run["history"]) == get_preset("cpu").train.epochs
    files = [tmp_path / f for f in ("synthetic-hkt-cpu-seed0.json", "predictions/synthetic-hkt-cpu-seed0.npz",
                                    "checkpoints/synthetic-hkt-cpu-seed0.pt")]
    before = {f: f.read_bytes() for f in files}
    capsys.readouterr()
    main(["--task", "synthetic", "--preset", "cpu", "--seed", "0", "--epochs", "1", "--device", "cpu",
          "--threads", "1", "--no-progress", "--results-dir", str(tmp_path)])
    printed = capsys.readouterr().out
    name = run_name("synthetic", "hkt", "cpu", 0, run_variant({"train": {"epochs": 1}}))
    assert {f: f.read_bytes() for f in files} == before  # the preset's run is as it was
    variant = json.loads((tmp_path / f"{name}.json").read_text())
    assert variant["run"] == name and variant["preset"] == "cpu" and variant["overrides"] == {"train": {"epochs": 1}}
    assert len(variant["history"]) == 1 and (tmp_path / "predictions" / f"{name}.npz").is_file()
    assert (tmp_path / "checkpoints" / f"{name}.pt").is_file() and variant["model_path"] == f"checkpoints/{name}.pt"
    assert f"a variant of preset 'cpu' (train epochs=1), written to {tmp_path.resolve() / name}.json" in printed, printed
    assert finished_run("synthetic", "hkt", "cpu", 0, tmp_path)["created"] == preset_run["created"]
    expected = {"synthetic-hkt-cpu-seed0"} | ({"listops-hkt-cpu-seed0"} if committed.is_file() else set())
    assert set(load_runs(tmp_path, "cpu")) == expected
    assert set(load_runs(tmp_path)) == expected | {name} and load_runs(tmp_path, "smoke") == {}
    assert load_or_train("synthetic", "hkt", "cpu", 0, results_dir=tmp_path, device="cpu")["loaded"] is True
    again = load_or_train("synthetic", "hkt", "cpu", 0, results_dir=tmp_path, epochs=1, **QUIET)
    assert again["loaded"] is False and again["run"] == name  # never the preset's record for a shortened run
    assert {f: f.read_bytes() for f in files} == before
