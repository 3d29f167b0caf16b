"""Tests of hkt_nb.stats (the appendix *How the verdicts are decided*) beyond the known answers in its notebook:
McNemar's p from scipy.stats.binomtest equals the hand-written exact sum it replaced on every pair of the committed
ListOps `cpu` runs; the multinomial paired bootstrap agrees with scipy.stats.bootstrap; the rule code shared with the
language model gives the verdicts that chapter computes today."""
import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from hkt_nb.stats import (
    binomial_two_sided_p,
    clears_baseline,
    counted_verdict,
    decide,
    learned_on_seeds,
    mcnemar_exact,
    mcnemar_power,
    paired_bootstrap,
    sd_interval_factors,
)

RESULTS = Path(__file__).resolve().parents[1] / "results"


def _hand_written_p(successes: int, trials: int) -> float:
    "The book's former McNemar p-value: twice the smaller binomial tail, in exact integer arithmetic, at most 1."
    tail = sum(math.comb(trials, i) for i in range(min(successes, trials - successes) + 1))
    return min(1.0, 2 * tail / 2**trials)


def test_mcnemar_p_from_binomtest_equals_the_hand_written_values_on_the_committed_listops_grid():
    from hkt_nb.lra.results import load_predictions, load_runs

    runs = load_runs(RESULTS, "cpu")
    models = ("hkt", "mha", "hkt_l1", "hkt_l2")
    checked = 0
    for seed in (0, 1, 2):
        correct = {}
        for model in models:
            name = f"listops-{model}-cpu-seed{seed}"
            assert name in runs, f"committed record {name} missing"
            predictions, labels = load_predictions(RESULTS, runs[name])
            assert len(labels) == 10_000
            correct[model] = predictions == labels
        for a, b in itertools.permutations(models, 2):
            test = mcnemar_exact(correct[a], correct[b])
            old = _hand_written_p(test["only_a"], test["only_a"] + test["only_b"])
            assert test["p_value"] == pytest.approx(old, rel=1e-9, abs=0), (seed, a, b, test)
            assert (test["p_value"] < 0.05) == (old < 0.05)  # every significance call is the one the book made
            checked += 1
    assert checked == 36
    # the numbers: hkt - mha on seed 0 is +3.03 points with p about 5e-12
    seed0 = mcnemar_exact(*(load_predictions(RESULTS, runs[f"listops-{m}-cpu-seed0"])[0]
                            == load_predictions(RESULTS, runs[f"listops-{m}-cpu-seed0"])[1] for m in ("hkt", "mha")))
    assert round(100 * seed0["difference"], 2) == 3.03 and 1e-12 < seed0["p_value"] < 1e-11


@pytest.mark.parametrize("successes,trials", [(0, 1), (3, 7), (50, 100), (49, 100), (0, 1075), (470, 1070), (4999, 10_000)])
def test_binomtest_p_equals_the_exact_sum(successes, trials):
    assert binomial_two_sided_p(successes, trials) == pytest.approx(_hand_written_p(successes, trials), rel=1e-9)


def test_power_cutoff_is_the_tests_own():
    "The rejection region is exactly where the p-value the rules use is below alpha, for every n_d up to 400."
    from hkt_nb.stats import _rejection_cutoff

    for n_d in range(0, 401):
        c = _rejection_cutoff(n_d, 0.05)
        assert all(_hand_written_p(k, n_d) < 0.05 for k in range(c + 1))
        assert c + 1 >= n_d / 2 or _hand_written_p(c + 1, n_d) >= 0.05
    assert mcnemar_power(1070, 10_000, 0.0) <= 0.05


def test_multinomial_bootstrap_agrees_with_scipy_bootstrap():
    "The same percentile interval as scipy.stats.bootstrap's index resampling, up to resampling noise."
    a = np.r_[np.ones(120), np.zeros(60), np.ones(300), np.zeros(120)].astype(bool)
    b = np.r_[np.zeros(120), np.ones(60), np.ones(300), np.zeros(120)].astype(bool)
    ours = paired_bootstrap(a, b, n_resamples=20_000)
    d = a.astype(float) - b.astype(float)
    theirs = stats.bootstrap((d,), np.mean, n_resamples=20_000, method="percentile", random_state=1).confidence_interval
    assert ours["difference"] == pytest.approx(d.mean())
    assert ours["low"] == pytest.approx(theirs.low, abs=0.004) and ours["high"] == pytest.approx(theirs.high, abs=0.004)


def test_sd_interval_factors_known_values():
    low, high = sd_interval_factors(3)  # df = 2: chi-square quantiles -2 ln(1 - p)
    assert low == pytest.approx(math.sqrt(2 / (-2 * math.log(0.025))), rel=1e-9)
    assert high == pytest.approx(math.sqrt(2 / (-2 * math.log(0.975))), rel=1e-9)
    assert sd_interval_factors(10)[0] < 1 < sd_interval_factors(10)[1]
    with pytest.raises(ValueError, match="at least 2"):
        sd_interval_factors(1)


def test_rule_five_reads_p_values_or_intervals():
    assert clears_baseline({"difference": 0.01, "p_value": 0.049}) and not clears_baseline({"difference": 0.01, "p_value": 0.05})
    assert clears_baseline({"difference": 0.2, "low": 0.1, "p_value": None})
    assert not clears_baseline({"difference": -0.2, "low": 0.1})
    with pytest.raises(KeyError):
        clears_baseline({"p_value": 0.01})
    fails = learned_on_seeds({0: {"difference": 0.1, "low": -0.01}}, "ngram7", 1.81)
    assert counted_verdict("hkt_l3 better than mha", fails, fails, ("hkt_l3", "mha"),
                           "not below the strongest n-gram baseline, {baseline}, on every seed") == (
        "excluded (hkt_l3 and mha have not learned the task: not below the strongest n-gram baseline, ngram7, on every seed)")


def test_the_language_model_gets_the_same_verdicts_from_the_shared_rule_code():
    """What the LM chapter must do at merge: rule 5 from `learned_on_seeds` on its bootstrap intervals, rules 1-5 from
    `decide`; on the committed LM records it gives exactly the verdicts of its own functions today."""
    lm = pytest.importorskip("hkt_nb.lm")
    records = lm.load_lm_runs("cpu", RESULTS / "lm")
    saved = lm.load_record(RESULTS / "lm" / "baselines-cpu.json")
    baseline = saved["baselines"][saved["strongest"]]
    learned, rows = lm.lm_comparisons(records, baseline)
    assert rows
    runs = {}
    for (model, seed), record in sorted(records.items()):
        runs.setdefault(model, {})[seed] = record
    shared = {}
    for model, by_seed in runs.items():
        per_seed = {s: lm.compare_lm(r, baseline) for s, r in by_seed.items()}
        shared[model] = learned_on_seeds({s: {"difference": c["difference"], "low": c["low"]} for s, c in per_seed.items()},
                                         baseline["model"], baseline["val_bpb"])
        assert shared[model]["learned"] == learned[model]["learned"] and shared[model]["below"] == learned[model]["below"]
    for row in rows:
        a, b = row["A"], row["B"]
        per_seed = [lm.compare_lm(runs[a][s], runs[b][s]) for s in sorted(set(runs[a]) & set(runs[b]))]
        out = decide(per_seed, shared[a], shared[b], (a, b), "not below the strongest n-gram baseline, {baseline}, on every seed")
        assert out["rule"] == row["rule"]  # rules 1-4: the same string
        # rule 5: the same outcome and the same models excluded (the LM may word the reason its own way)
        assert out["verdict"].split(":")[0] == row["verdict"].split(":")[0], (out, row)
