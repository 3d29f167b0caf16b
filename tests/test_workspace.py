"""Tests of hkt_nb.lra.runs (the time estimate) and hkt_nb.train.workspace (where records come from): the time estimate and the warning before the paper preset runs on a CPU."""
import json
import re
import warnings
from pathlib import Path

import pytest

from hkt_nb.lra.config import TASKS
from hkt_nb.lra import runs
from hkt_nb.lra.runs import estimate_seconds, estimated_time
from hkt_nb.train import workspace
from hkt_nb.train.workspace import records_url

REPO = Path(__file__).resolve().parents[1]


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



def test_the_estimate_skips_unreadable_records_with_a_warning_naming_them(tmp_path):
    committed = REPO / "results" / "listops-hkt-cpu_small-seed0.json"
    if not committed.is_file():
        pytest.skip("no committed cpu_small run")
    good = tmp_path / "listops-hkt-cpu_small-seed1.json"
    good.write_bytes(committed.read_bytes())
    reference = estimate_seconds("listops", "hkt", "paper", tmp_path)
    for content in ("{ truncated", "[]", "{}"):
        (tmp_path / "listops-hkt-cpu_small-seed0.json").write_text(content)  # sorted first: read before the good one
        with pytest.warns(UserWarning, match="time estimate: skipped unreadable record .*listops-hkt-cpu_small-seed0.json"):
            assert estimate_seconds("listops", "hkt", "paper", tmp_path) == reference
    good.unlink()
    with pytest.warns(UserWarning, match="skipped unreadable record"):
        assert estimate_seconds("listops", "hkt", "paper", tmp_path) is None


def test_the_estimate_reads_the_cpu_runs_first_then_the_first_cpu_preset(tmp_path):
    "`THROUGHPUT_PRESETS`: a finished `cpu` run gives the throughput when there is one, else a `cpu_small` run."
    committed = REPO / "results" / "listops-hkt-cpu_small-seed0.json"
    if not committed.is_file():
        pytest.skip("no committed cpu_small run")
    assert runs.THROUGHPUT_PRESETS == ("cpu", "cpu_small")
    record = json.loads(committed.read_text())
    (tmp_path / committed.name).write_text(json.dumps(record))
    assert runs._recorded_throughput("listops", "hkt", tmp_path) == (record["train_examples_per_s"], "cpu_small")
    assert runs._recorded_throughput("listops", "mha", tmp_path) is None
    faster = {**record, "run": "listops-hkt-cpu-seed0", "preset": "cpu", "train_examples_per_s": 2 * record["train_examples_per_s"]}
    (tmp_path / "listops-hkt-cpu-seed0.json").write_text(json.dumps(faster))
    assert runs._recorded_throughput("listops", "hkt", tmp_path) == (faster["train_examples_per_s"], "cpu")


class _Metadata:
    "The part of `importlib.metadata`'s message that `records_url` reads."
    def __init__(self, entries):
        self.entries = entries

    def get_all(self, key):
        return [v for k, v in self.entries if k == key] or None


def test_records_url_reads_the_source_project_url_never_the_home_page(monkeypatch):
    "Outside a clone (an installed wheel, e.g. on Colab) the repository is `Project-URL: Source`, not `Home-page`."
    import hkt_nb
    monkeypatch.setattr(workspace, "_clone_root", lambda start: None)
    site = ("Home-page", "https://hkt-nb.github.io/hkt_nb/")
    monkeypatch.setattr(workspace.metadata, "metadata", lambda name: _Metadata(
        [site, ("Project-URL", "Documentation, https://hkt-nb.github.io/hkt_nb/"),
         ("Project-URL", "Source, https://github.com/someone/hkt_nb.git")]))
    assert records_url() == f"https://raw.githubusercontent.com/someone/hkt_nb/v{hkt_nb.__version__}/results"
    monkeypatch.setattr(workspace.metadata, "metadata", lambda name: _Metadata([site]))
    with pytest.raises(RuntimeError, match="HKT_NB_RECORDS"):  # the book's site is no repository
        records_url()


def test_estimate_scales_with_the_sequence_length(tmp_path):
    "A preset whose data options shorten T (ListOps' short setting) is estimated from a T = 512 record, scaled by T."
    import shutil
    from dataclasses import replace

    from hkt_nb.lra.benchmarks import task_sizes
    from hkt_nb.lra.config import PRESETS, build_config
    from hkt_nb.model import count_parameters

    root = Path(__file__).resolve().parents[1] / "results"
    shutil.copy(root / "listops-hkt-cpu_small-seed0.json", tmp_path)  # the only throughput record: T = 512
    long = PRESETS["cpu_small"]
    short = replace(long, name="cpu_short", train=replace(long.train, task_options={"setting": "short"},
                                                          **long.per_task["listops"]))  # same sizes
    v, k = task_sizes("listops")
    params = count_parameters(build_config("listops", "hkt", short, v, k)) / count_parameters(build_config("listops", "hkt", long, v, k))
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(PRESETS, "cpu_short", short)  # same sizes at T = 128: a quarter, times the (tiny) parameter ratio
        short_s = estimate_seconds("listops", "hkt", short, tmp_path)
    assert build_config("listops", "hkt", short, v, k).max_len == 128
    assert short_s == pytest.approx(estimate_seconds("listops", "hkt", long, tmp_path) * params * 128 / 512)
