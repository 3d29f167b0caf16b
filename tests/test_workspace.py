"""Tests of hkt_nb.lra.workspace: the time estimate and the warning before the paper preset runs on a CPU."""
import re
import warnings
from pathlib import Path

import pytest

from hkt_nb.lra.config import TASKS
from hkt_nb.lra.workspace import estimated_time

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

