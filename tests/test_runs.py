"""Tests of hkt_nb.lra.runs: the command line (every value honoured or rejected), the experiment parameters as
papermill passes them, reuse of finished runs (the committed ones; execution-only fields never make a run stale)
and a shortened run that never replaces its preset's."""
import configparser
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hkt_nb.lra.config import get_preset, run_name, run_variant
from hkt_nb.lra.loop import train
from hkt_nb.lra.results import load_runs
from hkt_nb.lra.runs import check_experiment_parameters, finished_run, load_or_train, main, parse_args

REPO = Path(__file__).resolve().parents[1]
QUIET = dict(device="cpu", progress=False, verbose=False)


def test_cli_parses_and_rejects():
    a = parse_args(["--task", "imdb", "--model", "mha", "--preset", "cpu", "--seed", "2", "--device", "cuda",
                    "--data-dir", "/x", "--results-dir", "r", "--epochs", "3", "--threads", "1"])
    assert (a.task, a.model, a.preset, a.seed, a.device, a.data_dir, a.results_dir, a.epochs, a.threads) == \
        ("imdb", "mha", "cpu", 2, "cuda", "/x", "r", 3, 1)
    for bad in (["--task", "mnist"], ["--task", "listops", "--model", "rnn"], ["--task", "listops", "--preset", "x"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


@pytest.mark.parametrize("argument", [["--epochs", "0"], ["--epochs", "-2"], ["--threads", "0"], ["--seed", "-1"],
                                      ["--epochs", "two"], ["--seed", "1.5"], ["--device", "tpu"], ["--model", "rnn"],
                                      ["--time-budget", "-5"], ["--time-budget", "0"], ["--time-budget", "nan"],
                                      ["--time-budget", "inf"], ["--time-budget", "soon"]])
def test_cli_rejects_values_instead_of_ignoring_them(argument, capsys):
    "Exit status 2 and a message naming the argument and the value given (never read as 'not given')."
    with pytest.raises(SystemExit) as exit:
        parse_args(["--task", "listops", *argument])
    error = capsys.readouterr().err
    assert exit.value.code == 2 and f"argument {argument[0]}:" in error and argument[1] in error, error


def test_cli_honours_every_value():
    arguments = parse_args(["--task", "listops", "--epochs", "1", "--threads", "1", "--seed", "0"])
    assert (arguments.epochs, arguments.threads, arguments.seed) == (1, 1, 0)
    assert parse_args(["--task", "listops"]).epochs is None


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


@pytest.mark.parametrize("path", sorted((REPO / "results").glob("*-cpu_small-seed0.json")), ids=lambda p: p.stem)
def test_finished_run_accepts_the_committed_records(path):
    "The committed runs of the first CPU preset are finished runs of `cpu_small`, never of the redefined `cpu`."
    record = json.loads(path.read_text())
    found = finished_run(record["task"], record["model"], "cpu_small", 0, REPO / "results")
    assert found is not None and found["test_acc"] == record["test_acc"]
    from hkt_nb.lra.config import conforms_to_preset

    assert not conforms_to_preset(record, "cpu")  # the cpu grid's own run of that name, when committed, is another one
    cpu = finished_run(record["task"], record["model"], "cpu", 0, REPO / "results")
    assert cpu is None or (cpu["preset"] == "cpu" and cpu["run"] != record["run"])


def test_execution_only_fields_never_make_a_run_stale(tmp_path):
    source = REPO / "results" / "listops-hkt-cpu_small-seed0.json"
    if not source.is_file():
        pytest.skip("no committed cpu_small run")
    record = json.loads(source.read_text())
    record["config"]["train"]["num_workers"] = 4  # execution only
    (tmp_path / source.name).write_text(json.dumps(record))
    assert finished_run("listops", "hkt", "cpu_small", 0, tmp_path) is not None
    record["config"]["train"]["lr"] = 0.5  # result-relevant
    (tmp_path / source.name).write_text(json.dumps(record))
    assert finished_run("listops", "hkt", "cpu_small", 0, tmp_path) is None


def test_cli_epochs_1_never_overwrites_the_preset_run(tmp_path, capsys, one_thread):
    """`hkt-train --epochs 1` under the cpu preset (on the small synthetic task): the preset's record, predictions
    and model are left as they were, the shortened run is written under its variant name with its differences, and
    neither `finished_run`, `load_or_train` nor `load_runs(..., preset=...)` takes it for a run of the preset."""
    committed = REPO / "results" / "listops-hkt-cpu_small-seed0.json"
    if committed.is_file():  # a real committed record (first CPU preset) in the same folder must be untouched and still counted
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
    expected = {"synthetic-hkt-cpu-seed0"}
    small = {"listops-hkt-cpu_small-seed0"} if committed.is_file() else set()
    assert set(load_runs(tmp_path, "cpu")) == expected and set(load_runs(tmp_path, "cpu_small")) == small
    assert set(load_runs(tmp_path)) == expected | small | {name} and load_runs(tmp_path, "smoke") == {}
    assert load_or_train("synthetic", "hkt", "cpu", 0, results_dir=tmp_path, device="cpu")["loaded"] is True
    again = load_or_train("synthetic", "hkt", "cpu", 0, results_dir=tmp_path, epochs=1, **QUIET)
    assert again["loaded"] is False and again["run"] == name  # never the preset's record for a shortened run
    assert {f: f.read_bytes() for f in files} == before



def test_plot_colours_follow_the_arms_registry(temporary_arm):
    "Experiment.plot draws each arm in its own colour, C<k> for the k-th registered arm (a new arm included)."
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.colors import to_rgba

    from hkt_nb.lra.config import ARMS, PRESETS, Arm
    from hkt_nb.lra.runs import Experiment
    temporary_arm(Arm("hkt_s3", "hkt", {"stride": 3}, matched_to="hkt"))
    record = {"history": [{"epoch": 1, "val_acc": 0.5, "train_loss": 1.0}], "majority_test_acc": 0.25}
    experiment = Experiment("listops", PRESETS["smoke"], {}, PRESETS["smoke"].train,
                            {(model, 0): record for model in ("hkt", "mha", "hkt_s3")})
    accuracy_axis = experiment.plot().axes[0]
    colours = {line.get_label(): line.get_color() for line in accuracy_axis.get_lines()}
    for model in ("hkt", "mha", "hkt_s3"):
        assert to_rgba(colours[f"{model.upper()} seed 0"]) == to_rgba(f"C{list(ARMS).index(model)}")


# ---------------------------------------------------------------- issue 20: exit statuses, Ctrl-C, damaged records
CLI_SMALL = ["--task", "synthetic", "--device", "cpu", "--threads", "1", "--no-progress"]


def test_cli_time_budget_is_a_positive_number_of_seconds():
    assert parse_args(["--task", "listops", "--time-budget", "90"]).time_budget == 90.0
    assert parse_args(["--task", "listops", "--time-budget", "1e-3"]).time_budget == 0.001
    assert parse_args(["--task", "listops"]).time_budget is None


def test_cli_that_trained_nothing_exits_non_zero(tmp_path):
    "A budget spent before the first step: nothing trained, a one-line message and status 1 (not 0)."
    with pytest.raises(SystemExit) as exit_:
        main([*CLI_SMALL, "--results-dir", str(tmp_path), "--time-budget", "1e-9"])
    assert isinstance(exit_.value.code, str) and "nothing was trained" in exit_.value.code  # printed, status 1
    assert "--time-budget 1e-09" in exit_.value.code and not list(tmp_path.glob("*.json"))


def test_ctrl_c_before_any_epoch_says_nothing_was_checkpointed(tmp_path, monkeypatch, capsys):
    """KeyboardInterrupt in the first epoch: no traceback, status 130, one line saying (as a spent time budget does)
    that nothing was checkpointed, and the empty `checkpoints/<run>/` folder the call made is removed (lock too).
    A --checkpoint-dir that existed before is left in place."""
    from hkt_nb.lra import loop

    def interrupted(run, epoch):
        raise KeyboardInterrupt

    monkeypatch.setattr(loop, "train_one_epoch", interrupted)
    for extra in ([], ["--checkpoint-dir", str(tmp_path / "mine")]):
        (tmp_path / "mine").mkdir(exist_ok=True)
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_:
            main([*CLI_SMALL, "--results-dir", str(tmp_path / "my results"), "--no-resume", *extra])
        err = capsys.readouterr().err
        assert exit_.value.code == 130 and "Traceback" not in err
        lines = [line for line in err.splitlines() if line.startswith("hkt-train")]  # not datasets' bars
        assert lines == ["hkt-train: interrupted; no epoch finished, so nothing was checkpointed; the next run starts "
                         "afresh"], lines
        assert not (tmp_path / "my results" / "checkpoints").exists() and (tmp_path / "mine").is_dir()


def test_ctrl_c_after_an_epoch_prints_how_to_resume(tmp_path, monkeypatch, capsys, one_thread):
    """KeyboardInterrupt after the first epoch was checkpointed: one line with the exact command that resumes the run
    (the same arguments, without --no-resume), status 130; the checkpoint stays and the run's lock is released."""
    from hkt_nb.lra import loop
    real = loop.train_one_epoch

    def interrupted(run, epoch):
        if epoch == 1:
            raise KeyboardInterrupt
        return real(run, epoch)

    monkeypatch.setattr(loop, "train_one_epoch", interrupted)
    argv = [*CLI_SMALL, "--epochs", "2", "--results-dir", str(tmp_path / "my results"), "--no-resume"]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 130 and "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("hkt-train")]  # not datasets' bars
    expected = ("hkt-train --task synthetic --device cpu --threads 1 --no-progress --epochs 2 --results-dir "
                f"'{tmp_path / 'my results'}'")
    assert len(lines) == 1 and lines[0].endswith(f"resume with: {expected}"), lines
    assert len(list((tmp_path / "my results" / "checkpoints").glob("*/last.pt"))) == 1
    assert not list((tmp_path / "my results").rglob("*.lock"))


def test_cli_skips_a_finished_run_unless_retrain(tmp_path, monkeypatch, capsys, one_thread):
    """A finished record of the same configuration: `hkt-train` prints one line naming it and --retrain, exits 0 and
    trains nothing (the record untouched); `--retrain` trains it again and replaces the record. A variant
    (`--epochs 1`) is never a finished run of the preset: it trains every time, as before."""
    from hkt_nb.lra import runs
    calls, real = [], runs.train
    monkeypatch.setattr(runs, "train", lambda *a, **k: calls.append(k.get("epochs")) or real(*a, **k))
    argv = [*CLI_SMALL, "--results-dir", str(tmp_path)]
    main(argv)
    record = tmp_path.resolve() / "synthetic-hkt-smoke-seed0.json"
    before = record.read_bytes()
    capsys.readouterr()
    assert main(argv) is None
    out = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert out[-1] == f"synthetic-hkt-smoke-seed0 already finished: {record}; pass --retrain to train it again"
    assert calls == [None] and record.read_bytes() == before
    main([*argv, "--retrain"])
    assert calls == [None, None] and record.read_bytes() != before and json.loads(record.read_text())["complete"]
    main([*argv, "--epochs", "1"]), main([*argv, "--epochs", "1"])
    assert calls == [None, None, 1, 1]
    assert parse_args(["--task", "listops", "--retrain"]).retrain is True
    assert parse_args(["--task", "listops"]).retrain is False


def test_cli_refuses_a_damaged_record_of_its_run_in_one_line(tmp_path):
    "A damaged record of the run itself: one line naming it and --retrain (status 1), never trained over silently."
    damaged = tmp_path / "synthetic-hkt-smoke-seed0.json"
    damaged.write_text("[]")
    with pytest.raises(SystemExit) as exit_:
        main([*CLI_SMALL, "--results-dir", str(tmp_path)])
    assert exit_.value.code.startswith(f"hkt-train: unreadable record {damaged.resolve()}: a JSON list")
    assert exit_.value.code.endswith("pass --retrain to train over it") and damaged.read_text() == "[]"


@pytest.mark.parametrize("how", ["console script", "python -m"])
def test_hkt_train_without_the_lra_extra_names_it_in_one_line(how):
    """A core-only install (no `datasets`): `hkt-train` prints one line naming the [lra] extra, with its
    pre-release install from git (settings.ini's git_url), and exits 1; a library import still raises ImportError."""
    git_url = configparser.ConfigParser()
    git_url.read(REPO / "settings.ini")
    git_url = git_url["DEFAULT"]["git_url"]
    start = {"console script": "sys.argv = ['/venv/bin/hkt-train', '--task', 'listops']\n"
                               "from hkt_nb.lra.runs import main\nsys.exit(main())",
             "python -m": "import runpy\nsys.argv = ['runs', '--task', 'listops']\n"
                          "runpy.run_module('hkt_nb.lra.runs', run_name='__main__')"}[how]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = lambda code: subprocess.run([sys.executable, "-c", "import sys\nsys.modules['datasets'] = None\n" + code],
                                      capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    out = run(start)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert out.stderr.splitlines() == ['hkt-train: hkt_nb.lra needs the [lra] extra: pip install "hkt_nb[lra]" '
                                       f'(before its first PyPI release: pip install "hkt_nb[lra] @ git+{git_url}")']
    library = run("import hkt_nb.lra.runs")
    assert library.returncode == 1 and "ImportError: hkt_nb.lra needs the [lra] extra" in library.stderr


def test_every_install_hint_of_the_library_gives_the_pre_release_form(monkeypatch):
    """Until the first PyPI release `pip install "hkt_nb[<extra>]"` fails: every such hint in the library also gives
    the install from git; the [hub] one, computed from REPO_URL (settings.ini's git_url), is checked as raised."""
    from hkt_nb import pretrained
    hinted = [path for path in (REPO / "hkt_nb").rglob("*.py")
              if "pip install \"hkt_nb[" in path.read_text() or "pip install 'hkt_nb[" in path.read_text()]
    assert {p.relative_to(REPO / "hkt_nb").as_posix() for p in hinted} >= {"lra/listops.py", "pretrained.py", "lm/data.py"}
    for path in hinted:
        assert path.read_text().count("@ git+") >= 1, path
    assert pretrained.REPO_URL == "https://github.com/hkt-nb/hkt_nb"
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(ImportError, match=r'@ git\+https://github.com/hkt-nb/hkt_nb"\)$'):
        pretrained._hub()


def test_load_or_train_names_a_damaged_record_of_its_run(tmp_path):
    from hkt_nb.train.records import UnreadableRecordError
    damaged = tmp_path / "synthetic-hkt-smoke-seed0.json"
    damaged.write_text("[]")
    with pytest.raises(UnreadableRecordError, match=f"unreadable record {damaged}: a JSON list"):
        load_or_train("synthetic", results_dir=tmp_path, **QUIET)
    with pytest.raises(UnreadableRecordError, match=str(damaged)):
        finished_run("synthetic", "hkt", "smoke", 0, tmp_path)


def test_a_damaged_record_beside_a_run_of_its_task_warns_trains_and_shows_in_the_grid(tmp_path, capsys, one_thread):
    """Issue 20, item 2: a truncated `cpu` record of ListOps made every `hkt-train --task listops` fail before
    training (a bare JSONDecodeError from the time estimate). Now the estimate skips it with a warning naming it,
    the smoke run trains, and the results grid shows the damaged record as unreadable, not as "not yet run"."""
    from hkt_nb.lra.results import run_grid
    committed = REPO / "results" / "listops-hkt-cpu_small-seed0.json"
    damaged = tmp_path / "listops-hkt-cpu-seed0.json"
    damaged.write_text(committed.read_text()[:200] if committed.is_file() else '{"run": "listops-hkt-cpu-seed0", ')
    with pytest.warns(UserWarning, match=f"skipped unreadable record {damaged}: truncated"):
        main(["--task", "listops", "--model", "hkt", "--preset", "smoke", "--seed", "0", "--threads", "1",
              "--device", "cpu", "--no-progress", "--results-dir", str(tmp_path)])
    assert "estimated time on this CPU: unknown" in capsys.readouterr().out
    smoke = json.loads((tmp_path / "listops-hkt-smoke-seed0.json").read_text())
    assert smoke["complete"] and smoke["task"] == "listops"
    with pytest.warns(UserWarning, match=f"unreadable record {damaged}"):
        runs = load_runs(tmp_path, "cpu")
    (row,) = run_grid(tmp_path, runs, "cpu", expected={"listops": ("hkt",)}, seeds=(0,))
    assert row["status"].startswith(f"unreadable record {damaged}: truncated") and row["test_acc"] is None
    (smoke_row,) = run_grid(tmp_path, load_runs(tmp_path, "smoke"), "smoke", expected={"listops": ("hkt",)}, seeds=(0,))
    assert smoke_row["status"] == "finished" and smoke_row["test_acc"] == smoke["test_acc"]


def test_a_mistyped_results_folder_is_an_error_not_an_empty_grid(tmp_path):
    from hkt_nb.lra.results import copy_finished_runs, run_grid
    missing = tmp_path / "resluts"
    for call in (lambda: load_runs(missing), lambda: load_runs(missing, "cpu"), lambda: run_grid(missing, {}, "cpu"),
                 lambda: copy_finished_runs(missing, tmp_path / "dest")):
        with pytest.raises(FileNotFoundError, match=f"results_dir {missing} .*is not a folder"):
            call()


# ---------------------------------------------------------------- reader s8, items 2-4, 11, 23, 27, 30, 31: what the chapters show
def _committed_experiment(task, preset_name, models=("hkt", "mha")):
    "An Experiment of the committed runs of `preset_name` in results/ (skips when one is missing)."
    from hkt_nb.lra.runs import Experiment
    preset = get_preset(preset_name)
    records = {(m, s): finished_run(task, m, preset, s, REPO / "results") for m in models for s in preset.seeds}
    if None in records.values() or not (REPO / "results" / "baselines" / f"{task}-{preset_name}.json").is_file():
        pytest.skip(f"the committed {task} {preset_name} runs or baselines are not in results/")
    return Experiment(task, preset, {}, preset.train_config(task), records, REPO / "results")


def test_models_none_means_the_tasks_own_models():
    "Item 3: the chapters' `models = None` runs the registry's models, ListOps' hierarchy ablation included."
    from hkt_nb.lra.tasks import get_task
    assert check_experiment_parameters(**{**GOOD, "models": None})["models"] == ["hkt", "mha", "hkt_l1", "hkt_l2"]
    assert check_experiment_parameters(**{**GOOD, "task": "imdb", "models": None})["models"] == list(get_task("imdb").models)


def test_summary_shows_the_strongest_baseline_and_the_training_time_of_every_session():
    "Items 2 and 11: a column with the strongest baseline's test accuracy; time = train_time_s of all sessions, not wall."
    experiment = _committed_experiment("scifar10", "cpu_small")
    saved = json.loads((REPO / "results" / "baselines" / "scifar10-cpu_small.json").read_text())
    strongest = saved["strongest"]
    rows = experiment.summary()
    for row, record in zip(rows, experiment.results.values()):
        assert row[f"{strongest} test %"] == pytest.approx(100 * saved["baselines"][strongest]["test_acc"])
        assert row["training min (all sessions)"] * 60 == pytest.approx(sum(h["train_time_s"] for h in record["history"]))
        assert row["chosen by"] == "highest val acc"  # cpu_small was recorded before the lowest-validation-loss rule
    resumed = experiment.results["hkt", 1]  # trained over several sessions: its last one is a third of the time
    assert resumed["wall_time_s"] < 0.5 * resumed["train_time_s"]
    assert rows[1]["training min (all sessions)"] * 60 == pytest.approx(resumed["train_time_s"])


def test_plot_draws_the_strongest_baselines_validation_accuracy_and_labels_the_majority_as_test():
    "Item 23: the majority line is the test share (labelled so); the baseline line is at its validation accuracy."
    import matplotlib
    matplotlib.use("Agg")
    experiment = _committed_experiment("imdb", "cpu_small")
    baseline = experiment.baseline()
    lines = {line.get_label(): line for line in experiment.plot().axes[0].get_lines()}
    assert lines["majority class (test share)"].get_ydata()[0] == pytest.approx(
        100 * experiment.results["hkt", 0]["majority_test_acc"])
    assert lines[f"{baseline['name']} (strongest baseline, validation)"].get_ydata()[0] == pytest.approx(
        100 * baseline["val_acc"])


def test_verdict_names_who_beats_the_strongest_baseline_on_every_seed(tmp_path):
    "Item 2: one computed sentence; 'not evidence' when a model does not beat the bar; says so without baselines."
    from hkt_nb.lra.runs import Experiment
    small = _committed_experiment("scifar10", "cpu_small")  # HKT and MHA below a linear model on pixels
    text = small.verdict()
    assert text.startswith("On the test set no model here beats the strongest trivial baseline, pixels (27.05 %")
    assert "on every seed (not clearly above it: HKT 22.95 %, 22.70 %, 20.45 % on seeds 0, 1, 2; MHA" in text and "the HKT–MHA difference among them" in text
    listops = _committed_experiment("listops", "cpu_small", ("hkt", "mha", "hkt_l1", "hkt_l2"))
    text = listops.verdict()  # HKT above the root-operator rule on every seed, but not by McNemar's test on each
    assert text.startswith("On the test set no model here beats the strongest trivial baseline, root_operator (35.00 %")
    assert "(not clearly above it: HKT 36.40 %, 36.20 %, 35.65 % on seeds 0, 1, 2; MHA 34.75 %" in text
    assert "HKT_L2 34.75 %, 35.70 %, 35.05 % on seeds 0, 1, 2)" in text and "the HKT–MHA difference among them" in text
    cpu = _committed_experiment("listops", "cpu", ("hkt", "mha", "hkt_l1", "hkt_l2"))
    bar = cpu.baseline()
    assert cpu.verdict().startswith(
        "On the test set every model here (HKT, MHA, HKT_L1 and HKT_L2) beats the strongest trivial baseline, "
        f"{bar['name']} ({100 * bar['test_acc']:.2f} % on the test set), on every seed (McNemar's test against it on "
        "the same test examples: p < 0.05 for each run).")
    bare = Experiment("scifar10", small.preset, {}, small.train_config, small.results, tmp_path)
    assert bare.baseline() is None and "scifar10" not in bare.summary()[0] and "pixels test %" not in bare.summary()[0]
    assert bare.verdict().startswith("No trivial baselines are recorded for this task at preset `cpu_small` "
                                     "(baselines/scifar10-cpu_small.json is not in the results folder")


def test_selection_note_reads_the_records_rule():
    "Item 31: best epoch = lowest validation loss, except for records without `selection` (results version 1)."
    assert _committed_experiment("listops", "cpu").selection_note() == (
        "*Best epoch* is the epoch of the lowest validation loss, the checkpoint a run keeps and tests.")
    assert _committed_experiment("imdb", "cpu_small").selection_note().startswith(
        "*Best epoch* is the epoch of the highest validation accuracy: all 6 runs here were recorded before that rule")


def test_mix_moves_measure_lambda_and_gates_from_their_uniform_start():
    "Item 4: max |lambda - 1/L| and |g - 1/2| over layers and heads; 'near uniform' within UNIFORM_MIX_TOLERANCE."
    from hkt_nb.lra.runs import UNIFORM_MIX_TOLERANCE, Experiment, mix_moves
    record = {"lambdas": [[[0.3, 0.4, 0.3], [1 / 3, 1 / 3, 1 / 3]], [[0.25, 0.35, 0.4], [0.3, 0.3, 0.4]]],
              "gates": [[0.52, 0.49], [0.5, 0.47]]}
    moves = mix_moves(record)
    assert moves["lambda"] == pytest.approx(1 / 3 - 0.25) and moves["gate"] == pytest.approx(0.03)
    assert mix_moves({"lambdas": [[[1.0]]], "gates": [[0.5]]}) == {"lambda": 0.0, "gate": 0.0}  # one level: 1/L = 1
    assert mix_moves({}) == {"lambda": None, "gate": None}  # MHA
    assert UNIFORM_MIX_TOLERANCE == 0.05
    experiment = Experiment("listops", get_preset("smoke"), {}, get_preset("smoke").train, {("hkt", 0): record})
    assert experiment.mix_note().startswith("The largest move of any λ from 1/L is 0.083 (HKT seed 0) and of any g "
                                            "from 1/2 is 0.030 (HKT seed 0), over layers and heads: λ moved by more "
                                            "than 0.05")
    assert experiment.mix_note().endswith("while g stayed within it.")
    committed = _committed_experiment("scifar10", "cpu_small")  # the committed lambdas sit at their start
    largest = max(row["max |λ − 1/L|"] for row in committed.mix_moves())
    assert largest < UNIFORM_MIX_TOLERANCE and "moved less than 0.05 from their uniform start" in committed.mix_note()


def test_run_experiment_of_loaded_runs_prints_their_training_time_and_no_machine_path(capsys):
    "Items 27 and 30: nothing to train -> the recorded training time, no estimate; folders relative to the repository."
    from hkt_nb.lra.runs import run_experiment, training_seconds
    _committed_experiment("scifar10", "cpu_small")  # skips without the committed runs
    experiment = run_experiment("scifar10", preset="cpu_small", device="cpu", results_dir=REPO / "results")
    out = capsys.readouterr().out
    total = sum(training_seconds(r) for r in experiment.results.values())
    assert "results in the repository's results/\n" in out and str(REPO) not in out and "estimated time" not in out
    assert f"all 6 run(s) are finished and are loaded, nothing trains; their recorded training time: " \
           f"{total / 3600:.1f} h in all" in out
    assert "loaded the finished run from results/scifar10-hkt-cpu_small-seed0.json" in out


def test_planned_time_estimates_only_the_runs_left_to_train():
    "Item 30: with some runs loaded, the estimate covers the others, grouped by the seeds each model has left."
    from hkt_nb.lra.runs import _planned_time
    preset = get_preset("cpu_small")
    record = finished_run("scifar10", "hkt", preset, 0, REPO / "results")
    if record is None:
        pytest.skip("the committed scifar10 cpu_small runs are not in results/")
    finished = {("hkt", 0): record, ("hkt", 1): None, ("mha", 0): None, ("mha", 1): None}
    lines = _planned_time("scifar10", ["hkt", "mha"], preset, [0, 1], "cpu", REPO / "results", finished).splitlines()
    assert len(lines) == 2 and "for 1 run(s)" in lines[0] and "for 2 run(s)" in lines[1]
    assert lines[1].endswith("(1 of the 4 runs are finished and are loaded)")


def test_verdict_says_when_the_pilot_excludes_the_task():
    "A task every pilot candidate failed (sCIFAR-10 at `cpu`) is excluded even where its runs end above the baseline."
    from hkt_nb.lra.results import pilot_exclusions
    from hkt_nb.lra.runs import Experiment

    preset = get_preset("cpu")
    records = {(m, 0): finished_run("scifar10", m, preset, 0, REPO / "results") for m in ("hkt", "mha")}
    if None in records.values() or "scifar10" not in pilot_exclusions(REPO / "results", "cpu"):
        pytest.skip("no committed sCIFAR-10 cpu seed-0 runs, or the pilot does not exclude the task")
    text = Experiment("scifar10", preset, {}, preset.train_config("scifar10"), records, REPO / "results").verdict()
    assert text.endswith(" The task is excluded from the results chapter's verdicts at this preset: "
                         + pilot_exclusions(REPO / "results", "cpu")["scifar10"] + ".")
    listops = _committed_experiment("listops", "cpu", ("hkt", "mha", "hkt_l1", "hkt_l2"))
    assert ("excluded" in listops.verdict()) == ("listops" in pilot_exclusions(REPO / "results", "cpu"))
