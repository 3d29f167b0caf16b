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
    assert {p.name for p in hinted} >= {"listops.py", "pretrained.py", "lm.py"}
    for path in hinted:
        assert path.read_text().count("@ git+") >= 1, path
    assert pretrained.REPO_URL == "https://github.com/hkt-nb/hkt_nb"
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(ImportError, match=r'@ git\+https://github.com/hkt-nb/hkt_nb"\)$'):
        pretrained._hub()


def test_load_or_train_names_a_damaged_record_of_its_run(tmp_path):
    from hkt_nb.lra.records import UnreadableRecordError
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
