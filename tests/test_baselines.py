"""Tests for hkt_nb.lra.baselines (chapter 4, *Trivial baselines*): each baseline's known answer on hand-made splits,
hyper-parameters and the strongest baseline chosen on validation only, the registry's baselines resolve, and the committed
baselines of the CPU presets agree with their saved predictions and name the validation choice as the strongest."""
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sklearn")

from hkt_nb.lra import baselines as B  # noqa: E402
from hkt_nb.lra.tasks import BENCHMARKS, Task, get_task, registered  # noqa: E402
from hkt_nb.lra.tokenize import listops_encode  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results"


def labels_only(ys):
    return [np.array([5])] * len(ys), np.array(ys)


def listops(rows):
    return [np.array(listops_encode(src)) for src, _ in rows], np.array([y for _, y in rows])


def test_majority_names_both_numbers():
    splits = {"train": labels_only([2, 2, 2, 0, 1, 1]), "validation": labels_only([2, 0, 0]),
              "test": labels_only([0, 0, 0, 1, 2])}
    m = B.majority_baseline(splits, n_classes=3)
    assert m["train_majority_label"] == 2 and m["test_acc"] == pytest.approx(1 / 5)  # share of the TRAINING majority
    assert m["test_majority_label"] == 0 and m["test_majority_share"] == pytest.approx(3 / 5)  # the test set's own
    assert m["val_acc"] == pytest.approx(1 / 3)
    # its probabilities are the smoothed training frequencies (3+1, 1+1, 2+1) / 9
    prior = np.array([2, 3, 4]) / 9
    assert m["test_ce"] == pytest.approx(-np.mean(np.log(prior[[0, 0, 0, 1, 2]])))


def test_root_operator_rule_on_hand_made_expressions():
    train = listops([("[MAX 2 9 ]", 9), ("[MAX 3 ( [MIN 9 9 ] ) ]", 9), ("[MAX 1 4 ]", 4), ("[MED 1 2 3 ]", 2),
                     ("[SM 1 1 ]", 2), ("[SM 0 2 ]", 2), ("[SM 5 0 ]", 5)])
    test = listops([("[MAX 0 9 ]", 9), ("[SM 3 3 ]", 6), ("[MED 5 5 5 ]", 5), ("[MIN 1 2 ]", 1)])
    r = B.root_operator_baseline({"train": train, "validation": test, "test": test})
    assert r["rule"] == {"[MAX": 9, "[MED": 2, "[SM": 2}
    # MIN is unseen: the training majority (label 2: three of seven)
    assert r["test_pred"].tolist() == [9, 2, 2, 2] and r["test_acc"] == pytest.approx(1 / 4)
    # the probability of the MAX example's label 9: (2 + 1) / (3 + 10)
    assert np.isfinite(r["test_ce"]) and B.root_operator(np.array(listops_encode("[SM 1 2 ]"))) == listops_encode("[SM")[0]


def test_root_operator_rejects_empty():
    with pytest.raises(ValueError, match="sequence"):
        B.root_operator(np.array([], dtype=int))


def test_linear_baseline_separable_reaches_one():
    rng = np.random.default_rng(1)
    w = rng.normal(size=8)
    xs = {s: rng.normal(size=(n, 8)) for s, n in zip(B.SPLITS, (300, 80, 80))}
    xs = {s: x[np.abs(x @ w) > 0.5] for s, x in xs.items()}  # separable with a margin
    ys = {s: (x @ w > 0).astype(int) for s, x in xs.items()}
    r = B.linear_baseline(xs, ys, grid=(1e2, 1e4))
    assert r["val_acc"] == 1.0 and r["test_acc"] == 1.0


def test_choice_reads_validation_only():
    rng = np.random.default_rng(2)
    xs = {s: rng.normal(size=(n, 6)) for s, n in zip(B.SPLITS, (200, 60, 60))}
    ys = {s: (x[:, 0] + 0.8 * rng.normal(size=len(x)) > 0).astype(int) for s, x in xs.items()}
    a = B.linear_baseline(xs, ys, grid=(1e-4, 1e-2, 1.0))
    b = B.linear_baseline(xs, {**ys, "test": 1 - ys["test"]}, grid=(1e-4, 1e-2, 1.0))
    assert a["hyper"] == b["hyper"] and a["val_acc_by_C"] == b["val_acc_by_C"]
    assert a["test_acc"] == pytest.approx(1 - b["test_acc"])  # the test labels change only the test score
    assert B.choose_on_validation({1e-4: 0.5, 1e-2: 0.7, 1.0: 0.7}) == 1e-2  # ties: the first (smaller C)


def test_features():
    assert B.byte_unigram_features([np.array([1, 1, 3, 256])])[0, [0, 2, 255]].tolist() == [0.5, 0.25, 0.25]
    h = B.histogram_features([np.array([1, 9, 256, 129])])  # pixels 0, 8, 255, 128: bins 0, 1, 31, 16
    assert h[0, [0, 1, 16, 31]].tolist() == [0.25] * 4 and h.sum() == 1.0
    big = B.byte_bigram_features([np.array([5, 6, 5, 6, 5])], buckets=64)  # pairs (4,5) x2, (5,4) x2
    assert big.shape == (1, 64) and big.sum() == pytest.approx(1.0) and sorted(big.data) == [0.5, 0.5]
    assert B.pixel_features([np.array([1, 256])]).tolist() == [[0.0, 1.0]]
    with pytest.raises(ValueError, match="sequences"):
        B.pixel_features([np.array([1, 2]), np.array([1])])


def test_fit_baselines_uses_the_registry_and_checks_splits():
    task = Task("toy_bl", n_classes=2, vocab_size=257, seq_len=3, load=lambda *a, **k: None, tokenise=lambda b: b,
                baselines={"majority": "majority_baseline", "bytes": B.byte_unigram_baseline})
    seqs = lambda ys: ([np.array([2, 2, 3]) if y else np.array([3, 3, 2]) for y in ys], np.array(ys))
    with registered(task):
        fit = B.fit_baselines("toy_bl", "cpu", splits={"train": seqs([0, 0, 0, 1]), "validation": seqs([1, 0]),
                                                        "test": seqs([1, 1, 1, 0])})
        assert fit["baselines"]["majority"]["test_acc"] == 0.25 and fit["baselines"]["bytes"]["test_acc"] == 1.0
        assert fit["strongest"] == "bytes" and fit["sizes"] == {"train": 4, "validation": 2, "test": 4}
        with pytest.raises(ValueError, match="splits"):
            B.fit_baselines("toy_bl", "cpu", splits={"train": seqs([0, 1])})
    with registered(Task("toy_none", n_classes=2, vocab_size=3, seq_len=3, load=lambda *a, **k: None,
                         tokenise=lambda b: b)):
        with pytest.raises(ValueError, match="no baselines"):
            B.fit_baselines("toy_none", "cpu", splits={})


def fixed_baseline(val_acc, test_acc, n_features):
    "A baseline whose scores are given: for tests of the choice of the strongest."
    def baseline(splits, n_classes=None, seed=0):
        return {"val_acc": val_acc, "test_acc": test_acc, "test_ce": None, "hyper": {}, "n_features": n_features,
                "test_pred": np.zeros(len(splits["test"][1]), dtype=np.int64)}
    return baseline


def test_strongest_is_chosen_on_validation_not_test():
    # "val_best" is better on validation, "test_best" on test: the bar is the validation choice
    task = Task("toy_bar", n_classes=2, vocab_size=3, seq_len=1, load=lambda *a, **k: None, tokenise=lambda b: b,
                baselines={"test_best": fixed_baseline(0.50, 0.90, 5), "val_best": fixed_baseline(0.60, 0.40, 5)})
    with registered(task):
        fit = B.fit_baselines("toy_bar", "cpu", splits={s: labels_only([0, 1]) for s in B.SPLITS})
    assert fit["strongest"] == "val_best"
    assert max(fit["baselines"], key=lambda k: fit["baselines"][k]["test_acc"]) == "test_best"  # test would disagree
    # ties on validation: the fewer features, whatever the order; then the first in order
    tied = {"baselines": {"pixels": {"val_acc": 0.3, "test_acc": 0.9, "n_features": 1024},
                          "histogram": {"val_acc": 0.3, "test_acc": 0.2, "n_features": 32}}}
    assert B.strongest_baseline(tied) == "histogram"
    same = {"baselines": {"b": {"val_acc": 0.3, "test_acc": 0.1}, "a": {"val_acc": 0.3, "test_acc": 0.9}}}
    assert B.strongest_baseline(same) == "b"
    with pytest.raises(ValueError, match="no baselines"):
        B.strongest_baseline({"baselines": {}})


def test_fit_records_its_threads():
    "Known answers: under threadpoolctl's limit of 1 (and of 2) every loaded library reports that many threads."
    from threadpoolctl import threadpool_limits

    import numpy.linalg  # noqa: F401  (loads numpy's BLAS, so at least one kind is reported)

    threads = B.fit_threads()
    assert set(threads) == {"blas", "openmp"} and threads["blas"] is not None
    for limit in (1, 2):
        with threadpool_limits(limits=limit):
            assert {api: n for api, n in B.fit_threads().items() if n is not None} == {
                api: limit for api, n in threads.items() if n is not None}


COMMITTED = sorted((RESULTS / "baselines").glob("*.json")) + sorted((RESULTS / "pilot").glob("baselines-*.json"))


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_committed_strongest_is_the_validation_choice(path):
    "Every committed baselines record names as `strongest` the baseline that validation accuracy chooses."
    result = json.loads(path.read_text())
    assert result["strongest"] == B.strongest_baseline(result)


@pytest.mark.parametrize("task", list(BENCHMARKS))
def test_registry_baselines_resolve(task):
    names = get_task(task).baselines
    assert "majority" in names and all(n in B.BASELINES for n in names.values())


@pytest.mark.parametrize("preset", ["cpu", "cpu_small"])
@pytest.mark.parametrize("task", list(BENCHMARKS))
def test_committed_cpu_baselines_match_their_predictions(task, preset):
    path = RESULTS / "baselines" / f"{task}-{preset}.json"
    if not path.exists():
        pytest.skip(f"no committed baselines {path.name}")
    result = json.loads(path.read_text())
    assert result["preset"] == preset and set(result["baselines"]) == set(get_task(task).baselines)
    for name, r in result["baselines"].items():
        saved = np.load(RESULTS / "baselines" / "predictions" / f"{task}-{preset}-{name}.npz")
        assert len(saved["labels"]) == result["sizes"]["test"]
        assert (saved["predictions"] == saved["labels"]).mean() == pytest.approx(r["test_acc"], abs=1e-12)
    # the test labels are those of the runs' predictions (the same split, the same order)
    run = RESULTS / "predictions" / f"{task}-hkt-{preset}-seed0.npz"
    if run.exists():
        assert np.array_equal(np.load(run)["labels"], saved["labels"])


def test_saved_baseline_predictions_read_back_and_a_damaged_file_is_named(tmp_path):
    from hkt_nb.train.records import UnreadableRecordError

    labels, pred = np.array([0, 1, 1, 0]), np.array([0, 0, 1, 0])
    B.save_baselines({"task": "imdb", "preset": "cpu", "strongest": "rule", "test_labels": labels,
                      "baselines": {"rule": {"val_acc": 0.75, "test_acc": 0.75}}, "predictions": {"rule": pred}},
                     tmp_path)
    path = B.baseline_predictions_path(tmp_path, "imdb", "cpu", "rule")
    assert path == tmp_path / "baselines" / "predictions" / "imdb-cpu-rule.npz" and path.is_file()
    back_pred, back_labels = B.load_baseline_predictions(tmp_path, "imdb", "cpu", "rule")
    assert back_pred.tolist() == [0, 0, 1, 0] and back_labels.tolist() == [0, 1, 1, 0]
    assert B.load_baseline_predictions(tmp_path, "imdb", "cpu", "other") is None
    path.write_bytes(b"not a zip")
    with pytest.raises(UnreadableRecordError, match="imdb-cpu-rule.npz"):
        B.load_baseline_predictions(tmp_path, "imdb", "cpu", "rule")


def test_the_committed_baseline_predictions_score_their_recorded_accuracy():
    "Each committed baseline's saved test predictions reproduce the test accuracy its JSON records."
    results = Path(__file__).resolve().parents[1] / "results"
    checked = 0
    for preset in ("cpu", "cpu_small"):
        for task, saved in B.load_baselines(results, preset).items():
            for name, fit in saved["baselines"].items():
                loaded = B.load_baseline_predictions(results, task, preset, name)
                if loaded is not None:
                    assert np.mean(loaded[0] == loaded[1]) == pytest.approx(fit["test_acc"], abs=1e-9), (task, name)
                    checked += 1
    if not checked:
        pytest.skip("no committed baseline predictions")


def test_root_token_count_features_put_the_token_frequencies_in_the_root_operators_block():
    from hkt_nb.lra.tokenize import LISTOPS_OPERATORS, LISTOPS_VOCAB

    vocab = len(LISTOPS_VOCAB)
    expression = np.asarray(listops_encode("[MAX 2 9 [MIN 9 4 ] ]"))
    digit = np.asarray(listops_encode("7"))
    features = B.root_token_count_features([expression, digit])
    assert features.shape == (2, (len(LISTOPS_OPERATORS) + 1) * vocab)
    block = LISTOPS_OPERATORS.index("[MAX")
    row = features[0, block * vocab:(block + 1) * vocab]
    assert row[LISTOPS_VOCAB.index("9")] == pytest.approx(2 / len(expression))  # two 9s among the tokens
    assert row[LISTOPS_VOCAB.index("[MIN")] == pytest.approx(1 / len(expression))
    assert features[0].sum() == pytest.approx(1.0) and np.count_nonzero(features[0]) == np.count_nonzero(row)
    assert features[1, len(LISTOPS_OPERATORS) * vocab + LISTOPS_VOCAB.index("7")] == 1.0  # a lone digit: the last block
