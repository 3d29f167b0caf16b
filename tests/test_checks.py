"""Tests of hkt_nb._checks: each check returns the value it accepts and refuses the rest with `TypeError` (wrong type)
or `ValueError` (wrong value), the message starting with the argument's name."""
import math

import numpy as np
import pytest
import torch

from hkt_nb._checks import (
    check_bool,
    check_choice,
    check_device,
    check_float,
    check_heads,
    check_int,
    check_probability,
)


def test_check_int_accepts_python_and_numpy_integers():
    assert check_int("n", 3) == 3
    value = check_int("n", np.int64(3))
    assert value == 3 and type(value) is int
    assert check_int("n", 0, 0) == 0 and check_int("n", 5, 1, 5) == 5 and check_int("n", -7, None) == -7
    assert check_int("n", None, allow_none=True) is None


@pytest.mark.parametrize("value,error", [(True, TypeError), (np.bool_(True), TypeError), (2.0, TypeError),
                                         ("3", TypeError), (None, TypeError), (0, ValueError), (6, ValueError)])
def test_check_int_refuses(value, error):
    with pytest.raises(error, match="^n_levels"):
        check_int("n_levels", value, 1, 5)


def test_check_bool():
    assert check_bool("causal", False) is False and check_bool("causal", None, allow_none=True) is None
    for bad in ("false", 1, None, np.bool_(True)):
        with pytest.raises(TypeError, match="^causal"):
            check_bool("causal", bad)


def test_check_float_bounds_nan_and_inf():
    assert check_float("lr", 1) == 1.0 and type(check_float("lr", np.float32(0.5))) is float
    assert check_float("x", math.inf, 0, math.inf) == math.inf  # a closed infinite bound admits inf
    assert check_float("x", None, allow_none=True) is None
    for value, kwargs in [(math.nan, {}), (math.inf, {}), (-math.inf, {"high": 0}), (0.0, {"low": 0, "low_open": True}),
                          (1.0, {"high": 1, "high_open": True}), (-1e-9, {"low": 0}), (math.inf, {"low": 0, "high": math.inf, "high_open": True})]:
        with pytest.raises(ValueError, match="^lr"):
            check_float("lr", value, **kwargs)
    for bad in (True, "0.1", None, torch.tensor([0.1, 0.2])):
        with pytest.raises(TypeError, match="^lr"):
            check_float("lr", bad)


def test_check_probability():
    assert check_probability("dropout", 0) == 0.0 and check_probability("dropout", 0.999) == 0.999
    for bad in (1.0, 1.5, -0.5, math.nan):
        with pytest.raises(ValueError, match="^dropout"):
            check_probability("dropout", bad)
    with pytest.raises(TypeError, match="^dropout"):
        check_probability("dropout", "0.1")


def test_check_choice_lists_the_choices():
    assert check_choice("impl", "fused", ("fused", "explicit")) == "fused"
    with pytest.raises(ValueError, match="^impl.*'fused', 'explicit'"):
        check_choice("impl", "flash", ("fused", "explicit"))
    with pytest.raises(ValueError, match="^flag"):
        check_choice("flag", True, (1, 2))  # True == 1, but a bool is not one of the integer choices
    with pytest.raises(ValueError, match="^impl"):
        check_choice("impl", ["fused"], {"fused", "explicit"})  # unhashable


@pytest.mark.parametrize("good", ["auto", "cpu", "cuda", "cuda:0", "cuda:12", "mps"], ids=lambda d: f"device={d}")
def test_check_device_accepts_the_five_forms(good):
    assert check_device("device", good) == good
    if good != "auto":  # a torch.device is read as its string
        assert check_device("device", torch.device(good)) == str(torch.device(good))


@pytest.mark.parametrize("bad,error", [("gpu", ValueError), ("cuda:", ValueError), ("cuda:x", ValueError),
                                       ("CPU", ValueError), (" cpu", ValueError), (0, TypeError), (None, TypeError)])
def test_check_device_refuses(bad, error):
    with pytest.raises(error, match="^device"):
        check_device("device", bad)


def test_check_heads():
    check_heads(16, 4)
    for d_model, n_heads, name in [(10, 4, "n_heads"), (16, 0, "n_heads"), (16, 32, "n_heads"), (0, 1, "d_model")]:
        with pytest.raises(ValueError, match=f"^{name}"):
            check_heads(d_model, n_heads)
