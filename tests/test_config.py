"""Tests of hkt_nb.lra.config: parameter matching of the arms, the arms registry, run names and variants, the
validation of TrainConfig and RunSpec, conformance of records (every committed record; a field added with a
default; a changed value), and that the module imports no torch."""
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hkt_nb.lra.benchmarks import synthetic_benchmark
from hkt_nb.lra.config import (
    ARMS,
    PRESETS,
    CONFORMING_RESULTS_VERSIONS,
    RESULTS_VERSION,
    RESULTS_VERSIONS,
    TASKS,
    Arm,
    Preset,
    RunSpec,
    TrainConfig,
    build_config,
    conforms_to_preset,
    get_arm,
    get_preset,
    preset_differences,
    register_arm,
    run_identity,
    run_name,
    run_variant,
)
from hkt_nb.model import count_parameters

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("task", TASKS)
def test_mha_baseline_is_parameter_matched(task, preset):
    hkt = build_config(task, "hkt", PRESETS[preset], vocab_size=260, n_classes=10)
    mha = build_config(task, "mha", PRESETS[preset], vocab_size=260, n_classes=10)
    assert (hkt.attention, mha.attention) == ("hkt", "mha")
    assert (mha.d_model, mha.n_heads, mha.n_layers, mha.max_len) == (hkt.d_model, hkt.n_heads, hkt.n_layers, hkt.max_len)
    assert abs(count_parameters(mha) - count_parameters(hkt)) <= hkt.n_layers * (2 * hkt.d_model + 1) / 2


def test_train_config_rejects_bad_types():
    for field, value in (("epochs", 0), ("epochs", "2"), ("batch_size", 2.0), ("n_train", 0), ("n_val", "5")):
        with pytest.raises(TypeError if isinstance(value, (str, float)) else ValueError, match=field):
            TrainConfig(**{field: value})


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
    RunSpec("listops", "hkt", "cpu", 0, epochs=PRESETS["cpu"].train_config("listops").epochs,  # the preset's own values
            train_overrides={"amp": "auto", "n_train": PRESETS["cpu"].train_config("listops").n_train,
                             "task_options": PRESETS["cpu"].train_config("listops").task_options}),
    RunSpec("listops", "hkt", "cpu", 0, model_overrides={k: PRESETS["cpu"].model[k] for k in ("dropout", "d_model")})],
    ids=["plain", "execution-only", "compile-workers", "preset-values", "preset-model"])
def test_a_run_that_computes_what_the_preset_says_keeps_its_name(spec):
    assert run_identity(spec) == ("listops-hkt-cpu-seed0", {})


@pytest.mark.parametrize("field, value, error", [("seed", -1, ValueError), ("seed", "0", TypeError),
                                                 ("epochs", 0, ValueError), ("epochs", 1.0, TypeError)])
def test_run_spec_names_a_bad_field(field, value, error):
    with pytest.raises(error, match=field):
        RunSpec("listops", **{field: value})


def test_unknown_names_raise_naming_the_argument():
    with pytest.raises(ValueError, match="preset"):
        get_preset("nope")
    with pytest.raises(KeyError, match="model.*registered"):
        build_config("listops", "rnn", PRESETS["smoke"], 20, 10)


# ---------------------------------------------------------------- the arms registry
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_arm_is_its_variant_and_params_at_its_size(preset):
    configs = {name: build_config("listops", name, PRESETS[preset], 20, 10) for name in ARMS}
    for name, config in configs.items():
        arm = get_arm(name)
        assert config.attention == arm.attention
        assert arm.params.items() <= config.attention_params.items()
        if arm.matched_to is not None:
            target = count_parameters(configs[arm.matched_to])
            assert abs(count_parameters(config) - target) <= config.n_layers * (2 * config.d_model + 1) / 2
    assert [configs[f"hkt_l{n}"].attention_params["n_levels"] for n in (1, 2)] == [1, 2]
    assert configs["hkt"].attention_params["n_levels"] == PRESETS[preset].model["n_levels"]


def test_register_arm_checks_the_name_and_the_size_rule():
    with pytest.raises(ValueError, match="arm.name"):
        register_arm(Arm("hkt-2", "hkt"))
    with pytest.raises(KeyError, match="arm.matched_to"):
        register_arm(Arm("hkt_x", "hkt", matched_to="nothing"))
    assert "hkt_x" not in ARMS and "hkt-2" not in ARMS


# ---------------------------------------------------------------- records stay valid (issue 22, item 4)
COMMITTED = sorted((REPO / "results").glob("*-seed*.json"))  # the run records (`run_name`); benchmarks are not runs


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.stem)
def test_every_committed_record_conforms_to_its_preset(path):
    """A preset's run conforms to the preset; a variant (such as the runs kept by scripts/migrations/supersede_runs.py when a
    preset's size changed) is exactly its recorded differences from the preset, and its name says so."""
    from hkt_nb.lra.config import TrainConfig, preset_differences, run_variant

    record = json.loads(path.read_text())
    assert record.get("results_version", 1) in CONFORMING_RESULTS_VERSIONS
    if not record.get("variant"):
        assert conforms_to_preset(record, record["preset"]), path.name
        return
    train = TrainConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in record["config"]["train"].items()})
    assert record["overrides"] == preset_differences(record["task"], record["preset"], train), path.name
    assert record["variant"] == run_variant(record["overrides"]) and not conforms_to_preset(record, record["preset"])


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.stem)
def test_every_committed_record_is_named_by_its_fields(path):
    "A record's file, `run` and paths all carry `run_name` of its own fields (what scripts/migrations/rename_preset.py keeps true)."
    record = json.loads(path.read_text())
    name = run_name(record["task"], record["model"], record["preset"], record["seed"], record.get("variant"))
    assert record["run"] == name == path.stem
    for key in ("model_path", "predictions_path", "checkpoint_dir"):
        if record.get(key) is not None:
            assert Path(record[key]).name in (name, f"{name}.pt", f"{name}.npz"), (key, record[key])


def test_results_versions_say_what_changed_and_which_still_conform(committed_record):
    "Version 2 changed the tested checkpoint, not the training: a version-1 record still conforms, a later one not."
    assert RESULTS_VERSION == max(RESULTS_VERSIONS) == 2 and set(CONFORMING_RESULTS_VERSIONS) <= set(RESULTS_VERSIONS)
    for version, conforms in ((1, True), (2, True), (3, False)):
        assert conforms_to_preset({**committed_record, "results_version": version}, "cpu_small") is conforms, version
    unversioned = {k: v for k, v in committed_record.items() if k != "results_version"}  # absent = version 1
    assert conforms_to_preset(unversioned, "cpu_small")


def test_the_two_cpu_presets():
    """`cpu_small` is the first CPU preset kept as it was (its committed records conform to it, never to the new
    `cpu`); the redefined `cpu` keeps its model and seeds, scores every benchmark on its full test set or at least
    10,000 examples, and its ListOps setting sets the model's length (`Task.seq_len_for`)."""
    from hkt_nb.lra.tasks import BENCHMARKS, get_task

    cpu, small = PRESETS["cpu"], PRESETS["cpu_small"]
    assert cpu.model == small.model and cpu.seeds == small.seeds and cpu.train.save_model and small.train.save_model
    for task in BENCHMARKS:
        assert (cpu.train_config(task).n_test or float("inf")) >= 10_000, task
        assert small.train_config(task).n_test == small.train.n_test, task
    listops = get_task("listops")
    options = cpu.train_config("listops").task_options
    wanted = listops.seq_len_for(options)
    assert build_config("listops", "hkt", cpu, 16, 10).max_len == wanted and (options is None or wanted < listops.seq_len)
    assert build_config("listops", "hkt", small, 16, 10).max_len == listops.seq_len
    for path in COMMITTED:
        record = json.loads(path.read_text())
        if record["preset"] == "cpu_small":
            assert not conforms_to_preset(record, "cpu"), path.name


def test_the_cpu_description_says_the_margin_is_on_validation_and_is_not_configuration():
    """The `cpu` preset's `why` names the split the pilot's rule is applied to (chapter 5g: validation; its test
    margins are lower), and a record's `config.preset_why` is a copy taken at training time (chapter 5e): a record whose
    copy differs from today's description still conforms to its preset."""
    assert "by a margin on validation" in PRESETS["cpu"].why
    records = [json.loads(path.read_text()) for path in COMMITTED]
    cpu = [r for r in records if r["preset"] == "cpu" and not r.get("variant")]
    assert cpu, "no committed cpu record"
    record = cpu[0]
    assert conforms_to_preset({**record, "config": {**record["config"], "preset_why": "an older description"}}, "cpu")


def test_the_cpu_description_does_not_claim_the_pilot_sized_every_task():
    """The `cpu` preset's `why` says that a task the pilot did not size (chapter 5g: no qualifying candidate decided
    on, or the preset is not that candidate) trains at a provisional size, and is excluded where it failed; read
    against the committed pilot records, so it cannot again claim that every task was sized by the pilot."""
    from hkt_nb.lra.pilot import grid_candidate, load_pilot, pilot_decision

    decisions = pilot_decision(*load_pilot(REPO / "results"))
    sized = [t for t, d in decisions.items() if d["decided"] and d["chosen"] and grid_candidate(d["chosen"])]
    why = PRESETS["cpu"].why
    assert "chose where it decided on a candidate that qualified" in why
    if set(decisions) - set(sized):
        assert "provisional sizes elsewhere" in why and "failed the pilot is kept but excluded from the verdicts" in why


def test_the_cpu_small_description_holds_for_its_committed_runs():
    """`cpu_small`'s `why` says no model clears the task's strongest trivial baseline by more than test noise: every
    committed `cpu_small` run either does not score above that baseline on test or is not above it by McNemar's exact
    test at `ALPHA` (chapter 9), on the baseline's predictions for the same test examples."""
    import numpy as np

    from hkt_nb.lra.baselines import load_baselines
    from hkt_nb.lra.results import load_predictions, load_runs
    from hkt_nb.stats import ALPHA, mcnemar_exact

    assert "no model clears the task's strongest trivial baseline by more than test noise" in PRESETS["cpu_small"].why
    results = REPO / "results"
    runs, fits, checked = load_runs(results, "cpu_small"), load_baselines(results, "cpu_small"), 0
    for task, fit in fits.items():
        base = np.load(results / "baselines" / "predictions" / f"{task}-cpu_small-{fit['strongest']}.npz")
        for record in (r for r in runs.values() if r["task"] == task):
            predictions, labels = load_predictions(results, record)
            assert np.array_equal(labels, base["labels"]), record["run"]
            test = mcnemar_exact(predictions == labels, base["predictions"] == base["labels"])
            assert test["difference"] <= 0 or test["p_value"] >= ALPHA, (record["run"], test)
            checked += 1
    assert checked >= 3 * len(fits) > 0, checked  # every task's runs were read


@dataclasses.dataclass(frozen=True)
class ExtendedTrainConfig(TrainConfig):
    "TrainConfig with a field added later, with a default (as a future version of the library might add one)."
    label_smoothing: float = 0.0


def _extended(preset: Preset) -> Preset:
    return dataclasses.replace(preset, train=ExtendedTrainConfig(**dataclasses.asdict(preset.train)))


def test_a_field_added_with_a_default_changes_nothing(committed_record):
    extended = _extended(PRESETS["cpu_small"])
    assert conforms_to_preset(committed_record, extended)  # the stored config lacks the field: its default
    stored = committed_record["config"]["train"]
    with_field = {**committed_record, "config": {**committed_record["config"], "train": {**stored, "label_smoothing": 0.0}}}
    assert conforms_to_preset(with_field, extended)
    model = {k: v for k, v in committed_record["config"]["model"].items() if k not in ("causal", "attn_dropout")}
    fewer = {**committed_record, "config": {**committed_record["config"], "model": model}}
    assert conforms_to_preset(fewer, "cpu_small")  # model fields missing from a record take their defaults too


@pytest.mark.parametrize("part, key, value", [("train", "label_smoothing", 0.1), ("train", "lr", 0.5),
                                              ("train", "epochs", 1), ("model", "d_model", 32),
                                              ("model", "n_levels", 2), ("record", "results_version", 2)])
def test_a_changed_result_relevant_value_does_not_conform(committed_record, part, key, value):
    record = json.loads(json.dumps(committed_record))
    if part == "record":
        record[key] = RESULTS_VERSION + 1
    else:
        record["config"][part][key] = value
    assert not conforms_to_preset(record, _extended(PRESETS["cpu_small"]))


def test_config_imports_no_torch():
    "run_name, the presets and the arms are read without torch (the results chapter and the run queue use them)."
    code = ("import sys, types; package = types.ModuleType('hkt_nb'); package.__path__ = [sys.argv[1]]; "
            "sys.modules['hkt_nb'] = package; import hkt_nb.lra.config as config; "
            "assert config.run_name('listops', 'hkt', 'cpu', 0) == 'listops-hkt-cpu-seed0'; "
            "assert 'torch' not in sys.modules, 'torch was imported by ' + ', '.join(sorted(m for m in sys.modules "
            "if m.startswith('hkt_nb')))")  # then import the model and data code lazily (as build_config does)
    subprocess.run([sys.executable, "-c", code, str(REPO / "hkt_nb")], check=True, timeout=120,
                   env={**os.environ, "PYTHONPATH": str(REPO)})


def test_a_variant_parameter_override_keeps_the_name_it_had_before_the_registry():
    "Overrides of HKT's own parameters are hashed in the flat form, so such variants keep their names."
    name, differences = run_identity(RunSpec("listops", "hkt", "cpu", 0, model_overrides={"n_levels": 2}))
    assert differences == {"model": {"n_levels": 2}}
    assert name == run_name("listops", "hkt", "cpu", 0, run_variant({"model": {"n_levels": 2}}))


@pytest.mark.parametrize("field, value", [("time_budget_s", -5), ("time_budget_s", float("nan")),
                                          ("time_budget_s", float("inf")), ("time_budget_s", "90"), ("stop_after", -1)])
def test_run_options_refuse_a_budget_that_is_no_budget(field, value):
    "Issue 20: a negative, NaN or infinite time budget trained nothing, or meant 'no budget'; now refused by name."
    from hkt_nb.lra.config import RunOptions
    with pytest.raises((TypeError, ValueError), match=field):
        RunOptions(**{field: value})
    assert RunOptions(time_budget_s=0.0).time_budget_s == 0.0 and RunOptions(stop_after=0).stop_after == 0
