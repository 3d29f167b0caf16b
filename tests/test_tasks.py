"""Tests for hkt_nb.lra.tasks (chapter 4, *The task registry*): the lookup and its errors, the record's checks, the
views other modules read (benchmarks, presets, results grid, chapters, run plan), a toy task added and trained in
the test itself, and no task-name comparison left in the library outside the registry."""
import json
import re
import subprocess
import sys
from pathlib import Path

import datasets
import numpy as np
import pytest

from hkt_nb.lra import tasks as T
from hkt_nb.lra.listops import LISTOPS_SETTINGS
from hkt_nb.lra.tokenize import BYTE_VOCAB_SIZE, LISTOPS_VOCAB

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- a toy task, defined in the test alone
def toy_load(task, *, sizes, caps, seed, cache_root, data_dir=None):
    """A few hundred examples built in memory: 24 words from {0, 1, 2}; the label says whether word 1 occurs more
    often than word 2. Columns are the toy's own (`words`, `more_ones`), so that its tokeniser has work to do."""
    rng = np.random.default_rng(seed)
    out = {}
    for split, n in (("train", 200), ("validation", 50), ("test", 50)):
        n = min(x for x in (n, sizes[split], caps[split]) if x is not None)
        words = rng.integers(0, 3, (n, 24))
        more_ones = ((words == 1).sum(1) > (words == 2).sum(1)).astype(int)
        out[split] = datasets.Dataset.from_dict({"words": words.tolist(), "more_ones": more_ones.tolist()})
    return out


def toy_tokenise(batch):
    return {"input_ids": [[word + 1 for word in row] for row in batch["words"]], "label": batch["more_ones"]}


def toy_task(**changes):
    fields = dict(name="toy", n_classes=2, vocab_size=4, seq_len=24, load=toy_load, tokenise=toy_tokenise,
                  sizes={"smoke": {"epochs": 1}}, models=("hkt", "mha"), chapter="99_toy", title="a toy task")
    return T.Task(**{**fields, **changes})


def test_a_toy_task_trains_and_reaches_the_results_grid(tmp_path, one_thread):
    from hkt_nb.lra.config import PRESETS, SEQ_LEN, TASKS
    from hkt_nb.lra.loop import train
    from hkt_nb.lra.results import EXPECTED_MODELS, load_runs, run_grid

    toy = toy_task()
    with T.registered(toy):
        assert "toy" in TASKS and SEQ_LEN["toy"] == 24 and EXPECTED_MODELS["toy"] == ("hkt", "mha")
        assert PRESETS["smoke"].train_config("toy").epochs == 1 and T.chapters()[-1] == "99_toy"
        record = train("toy", "hkt", "smoke", 0, device="cpu", results_dir=tmp_path, progress=False, verbose=False)
        assert record["complete"] and record["run"] == "toy-hkt-smoke-seed0" and len(record["history"]) == 1
        assert (record["data"]["vocab_size"], record["data"]["n_classes"], record["data"]["seq_len"]) == (4, 2, 24)
        assert record["data"]["n_train"] == 200 and record["config"]["model"]["max_len"] == 24
        with np.load(tmp_path / record["predictions_path"]) as arrays:
            labels, predictions = arrays["labels"], arrays["predictions"]
        truth = toy_load(toy, sizes=dict.fromkeys(("train", "validation", "test")), caps=dict.fromkeys(
            ("train", "validation", "test")), seed=0, cache_root=None)["test"]["more_ones"]
        assert labels.tolist() == truth and np.isclose(record["test_acc"], (predictions == labels).mean())
        runs = load_runs(tmp_path, "smoke")  # conforms to the smoke preset as the registry defines the toy
        assert list(runs) == ["toy-hkt-smoke-seed0"]
        rows = [row for row in run_grid(tmp_path, runs, "smoke", seeds=(0,)) if row["task"] == "toy"]
        assert rows == [{"task": "toy", "model": "hkt", "seed": 0, "status": "finished", "test_acc": record["test_acc"]},
                        {"task": "toy", "model": "mha", "seed": 0, "status": "not yet run", "test_acc": None}]
    assert "toy" not in T.TASKS and "toy" not in TASKS and "toy" not in EXPECTED_MODELS
    with pytest.raises(KeyError, match="toy"):
        PRESETS["smoke"].train_config("toy")


def test_registered_restores_a_replaced_task():
    original = T.get_task("imdb")
    with T.registered(toy_task(name="imdb")):
        assert T.get_task("imdb").title == "a toy task"
    assert T.get_task("imdb") is original


# ---------------------------------------------------------------- lookup and registration
def test_unknown_task_is_a_key_error_listing_the_registered_ones():
    with pytest.raises(KeyError, match="task") as caught:
        T.get_task("pathfinder")
    assert isinstance(caught.value, ValueError)  # callers that check arguments catch it too
    assert all(name in str(caught.value) for name in ("listops", "scifar10", "imdb", "synthetic"))
    with pytest.raises(KeyError, match="task"):
        T.TaskTable("seq_len")["pathfinder"]
    with pytest.raises(KeyError, match="task"):
        T.TaskTable("models", benchmarks_only=True)["synthetic"]  # registered, but not a benchmark


def test_register_refuses_a_taken_name_and_a_non_task():
    with pytest.raises(ValueError, match="task"):
        T.register_task(toy_task(name="listops"))
    with pytest.raises(TypeError, match="task"):
        T.register_task({"name": "toy"})
    T.register_task(toy_task())
    try:
        assert T.get_task("toy").vocab_size == 4 and "toy" in T.BENCHMARKS
    finally:
        assert T.unregister_task("toy").name == "toy"
    with pytest.raises(KeyError, match="task"):
        T.unregister_task("toy")


@pytest.mark.parametrize("changes, error, argument", [
    (dict(name="my-task"), ValueError, "name"), (dict(name="Toy"), ValueError, "name"),
    (dict(n_classes=1), ValueError, "n_classes"), (dict(n_classes=2.0), ValueError, "n_classes"),
    (dict(vocab_size=70_000), ValueError, "vocab_size"), (dict(seq_len=0), ValueError, "seq_len"),
    (dict(load=42), TypeError, "load"), (dict(tokenise=None), TypeError, "tokenise"),
    (dict(sizes={"smoke": 1}), TypeError, "sizes"), (dict(pairs=(("hkt", "hkt_l1"),)), ValueError, "pairs"),
    (dict(paper={"s4": (1.0, 0.1)}), ValueError, "paper")])
def test_task_checks_its_fields(changes, error, argument):
    with pytest.raises(error, match=argument):
        toy_task(**changes)


def test_a_loader_named_by_a_string_is_found_in_the_data_module(tmp_path):
    """The built-in tasks name their loaders (the registry imports no data module, so no import circle): the name is
    looked up in hkt_nb.lra.benchmarks when data are loaded; a name it does not define is refused, naming it."""
    from hkt_nb.lra import benchmarks
    assert T.get_task("listops").load == "listops_splits" and callable(getattr(benchmarks, "listops_splits"))
    assert benchmarks._loader(T.get_task("synthetic")) is benchmarks.synthetic_splits
    assert benchmarks._loader(toy_task()) is toy_load  # a function passes through
    with pytest.raises(ValueError, match="no_such_loader"):
        benchmarks.load_benchmark(toy_task(load="no_such_loader"), cache=tmp_path)


def test_pairs_default_to_the_first_model_against_each_other():
    assert toy_task(models=("hkt", "mha", "hkt_l1")).pairs == (("hkt", "mha"), ("hkt", "hkt_l1"))
    with pytest.raises(ValueError, match="field_name"):
        T.TaskTable("colour")


# ---------------------------------------------------------------- the book's tasks and what derives from them
def test_the_registered_benchmarks():
    assert tuple(T.BENCHMARKS) == ("listops", "scifar10", "imdb")  # the run queue's order: ListOps first
    listops, scifar, imdb = (T.get_task(name) for name in T.BENCHMARKS)
    assert (listops.vocab_size, listops.n_classes, listops.seq_len) == (len(LISTOPS_VOCAB), 10, 512)
    assert listops.seq_len == LISTOPS_SETTINGS["paper"]["seq_len"] and listops.train_size == 96_000
    assert (scifar.vocab_size, scifar.n_classes, scifar.seq_len, scifar.train_size) == (BYTE_VOCAB_SIZE, 10, 1024, 45_000)
    assert (imdb.vocab_size, imdb.n_classes, imdb.seq_len, imdb.train_size) == (BYTE_VOCAB_SIZE, 2, 1024, 25_000 - 2_500)
    from hkt_nb.lra.baselines import BASELINES  # the slot names functions of chapter 4's trivial baselines
    assert all("majority" in task.baselines and set(task.baselines.values()) <= set(BASELINES)
               for task in (listops, scifar, imdb))
    assert listops.baselines["root_operator"] == "root_operator_baseline"
    assert all((REPO / "nbs" / f"{chapter}.ipynb").is_file() for chapter in T.chapters())
    assert T.get_task("synthetic").chapter is None and "synthetic" not in T.BENCHMARKS


def test_chapters_and_plan_from_the_command_line(repo_root):
    run = lambda *args: subprocess.run([sys.executable, "-m", "hkt_nb.lra.tasks", *args], capture_output=True,
                                       text=True, cwd=repo_root, check=True).stdout.split("\n")
    assert run("chapters")[0] == "06_listops 07_scifar10 08_imdb"
    plan = [tuple(line.split()) for line in run("plan") if line]
    assert plan == T.experiment_plan() and plan[:4] == [("listops", m) for m in ("hkt", "mha", "hkt_l1", "hkt_l2")]
    assert [task for task, _ in plan] == sorted((t for t, _ in plan), key=list(T.BENCHMARKS).index)


def test_help_prints_the_usage_and_exits_0(repo_root, capsys):
    "`python -m hkt_nb.lra.tasks --help` (and `-h`) prints the usage with status 0; an unknown word still exits 1."
    out = subprocess.run([sys.executable, "-m", "hkt_nb.lra.tasks", "--help"], capture_output=True, text=True,
                         cwd=repo_root)
    assert out.returncode == 0 and out.stdout.startswith("usage: python -m hkt_nb.lra.tasks chapters|names|plan\n")
    assert T.main(["-h"]) is None and capsys.readouterr().out == out.stdout
    with pytest.raises(SystemExit, match=r"^usage: python -m hkt_nb.lra.tasks chapters\|names\|plan \(got 'x'\)$"):
        T.main(["x"])


def test_presets_take_their_task_sizes_and_seeds_from_the_registry():
    from hkt_nb.lra.config import PRESETS
    from hkt_nb.lra.results import SEEDS

    assert PRESETS["cpu"].seeds == PRESETS["paper"].seeds == SEEDS == T.SEEDS == (0, 1, 2)
    for preset in PRESETS.values():
        for name in T.TASKS:
            wanted = T.get_task(name).sizes.get(preset.name, {})
            assert {k: getattr(preset.train_config(name), k) for k in wanted} == wanted
        assert preset.per_task == {n: t.sizes[preset.name] for n, t in T.TASKS.items() if preset.name in t.sizes}


@pytest.mark.parametrize("path", sorted((REPO / "results").glob("*-cpu_small-seed*.json")), ids=lambda p: p.stem)
def test_committed_cpu_small_runs_have_the_registry_sizes(path):
    "The per-task sizes moved into the registry unchanged: every committed run of the first CPU preset was trained with them."
    from hkt_nb.lra.config import PRESETS

    record = json.loads(path.read_text())
    wanted = PRESETS["cpu_small"].train_config(record["task"])
    assert {k: record["config"]["train"][k] for k in ("n_train", "n_val", "n_test", "epochs", "batch_size")} == {
        k: getattr(wanted, k) for k in ("n_train", "n_val", "n_test", "epochs", "batch_size")}


# ---------------------------------------------------------------- no task-name comparison outside the registry
NAMES = "|".join(("listops", "imdb", "scifar10", "cifar10", "synthetic"))
COMPARISON = re.compile(rf"""[=!]=\s*["']({NAMES})["']|["']({NAMES})["']\s*[=!]=|\bin\s*[(\[{{][^)\]}}]*["']({NAMES})["']"""
                        rf"""|\.startswith\(\s*["']({NAMES})""")


def test_no_task_name_comparison_outside_the_registry():
    found = []
    for path in sorted((REPO / "hkt_nb").rglob("*.py")):
        if path.name in ("tasks.py", "_modidx.py"):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if COMPARISON.search(line.split("#")[0]):
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert found == [], "\n".join(found)
    assert COMPARISON.search('name = "imdb" if task == "imdb" else "cifar10"')  # the pattern finds the old bug


@pytest.mark.parametrize("path", ["Makefile", "scripts/build_book.py", "scripts/run_experiments.py", "scripts/tag_cells.py"])
def test_build_files_hold_no_typed_task_list(path):
    text = (REPO / path).read_text()
    assert not re.search(r"0[678]_(listops|scifar10|imdb)|[\"'](listops|scifar10|imdb)[\"']", text), path


def _script(repo_root, name):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, repo_root / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_scripts_read_chapters_and_queue_from_the_registry(build_book, repo_root, tmp_path):
    assert build_book.experiment_chapters() == tuple(T.chapters())
    assert _script(repo_root, "tag_cells").chapters() == (*T.chapters(), "09_results", "10_cost")
    runner = _script(repo_root, "run_experiments")
    assert runner.plan() == T.experiment_plan()
    todo = runner.queue("cpu_small", None, tmp_path)  # an empty results folder: every run of the plan, three seeds each
    assert len(todo) == len(T.experiment_plan()) * len(T.SEEDS)
    assert [task for task, _, _ in todo] == sorted((t for t, _, _ in todo), key=list(T.BENCHMARKS).index)
    assert todo[:4] == [("listops", m, 0) for m in ("hkt", "mha", "hkt_l1", "hkt_l2")]
    # at `cpu` no pilot has decided in an empty folder: seed 0 only, the pilot runs of the grid candidates
    assert runner.queue("cpu", None, tmp_path) == [r for r in todo if r[2] == 0]
    assert runner.undecided("cpu", tmp_path) == set(T.BENCHMARKS) and runner.undecided("cpu_small", tmp_path) == set()
    # the committed records: the queue waits exactly on the tasks the pilot has not decided (chapter 5g)
    from hkt_nb.lra.pilot import load_pilot, pilot_decision
    decision = pilot_decision(*load_pilot(REPO / "results"))
    assert runner.undecided("cpu", REPO / "results") == {t for t, d in decision.items() if not d["decided"]}
    assert {task for task, _, _ in runner.queue("cpu", {"imdb"}, tmp_path)} == {"imdb"}
    # the tasks the committed pilot excludes come after every other task (a stable sort: registry order otherwise)
    out = runner.excluded("cpu", REPO / "results")
    tasks = [task for task, _, _ in runner.queue("cpu", None, REPO / "results")]
    assert tasks == sorted(tasks, key=lambda t: (t in out, list(T.BENCHMARKS).index(t)))
    assert runner.excluded("cpu", tmp_path) == set() and runner.excluded("cpu_small", REPO / "results") == set()
    with pytest.raises(KeyError, match="task"):
        runner.queue("cpu", {"pathfinder"}, tmp_path)


def test_queue_trains_chosen_models_and_seeds(repo_root, tmp_path):
    # rule 7's fresh seeds (chapter 9): seeds 3-9 of hkt and mha only, seed-major, on an empty folder at cpu_small
    runner = _script(repo_root, "run_experiments")
    todo = runner.queue("cpu_small", {"listops"}, tmp_path, {"hkt", "mha"}, list(range(3, 10)))
    assert todo == [("listops", m, s) for s in range(3, 10) for m in ("hkt", "mha")]
    # the committed records: ListOps seeds 0-2 of the cpu grid are finished, so asking for them queues nothing
    assert runner.queue("cpu", {"listops"}, REPO / "results", {"hkt", "mha"}, [0, 1, 2]) == []


def test_queue_deadline_starts_only_runs_that_fit(repo_root):
    runner = _script(repo_root, "run_experiments")
    assert runner.fits_before(None, None, 0.0)  # no deadline: everything starts
    assert runner.fits_before(1000.0, 1000.0 / runner.SAFETY - 1.0, 0.0)
    assert not runner.fits_before(1000.0, 1000.0 / runner.SAFETY + 1.0, 0.0)
    assert not runner.fits_before(1000.0, None, 0.0)  # no estimate: not started before a deadline
    now = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC
    assert runner.parse_stop_at("23:00", now) == now + 46 * 60 + 40
    assert runner.parse_stop_at("22:00", now) == now + 86400 - 13 * 60 - 20  # passed today: tomorrow's
    assert runner.parse_stop_at(None, now) is None


def test_seq_len_for_follows_the_task_options():
    "T comes from the task's options (ListOps' setting), the defaults when none are given; unknown options are refused."
    listops = T.get_task("listops")
    assert listops.seq_len_for() == listops.seq_len_for(None) == 512
    assert listops.seq_len_for({"setting": "short"}) == LISTOPS_SETTINGS["short"]["seq_len"] == 128
    assert listops.seq_len_for({"setting": "lra"}) == 2000
    assert T.get_task("scifar10").seq_len_for() == 1024 and T.get_task("scifar10").seq_len_for({"rgb": True}) == 3072
    with pytest.raises(ValueError, match="unknown option"):
        listops.seq_len_for({"colour": True})
    with pytest.raises(ValueError, match="setting"):
        listops.seq_len_for({"setting": "medium"})


def test_task_options_reach_the_model_and_the_data(tmp_path):
    "A preset whose TrainConfig has task_options builds a model of that T and loads data of that setting."
    from dataclasses import replace

    from hkt_nb.lra.benchmarks import load_task
    from hkt_nb.lra.config import PRESETS, TrainConfig, build_config

    with pytest.raises(TypeError, match="task_options"):
        TrainConfig(task_options=["short"])
    preset = replace(PRESETS["smoke"], train=replace(PRESETS["smoke"].train, task_options={"setting": "short"}))
    assert build_config("listops", "hkt", preset, 16, 10).max_len == 128
    assert build_config("listops", "hkt", PRESETS["smoke"], 16, 10).max_len == 512
    data = load_task("listops", caps={"train": 40, "validation": 20, "test": 20}, options={"setting": "short"})
    lengths = [len(ids) for ids in data["train"]["input_ids"]]
    assert 32 < min(lengths) and max(lengths) < 129  # the window's strict bounds (tokens: the generator's length)
