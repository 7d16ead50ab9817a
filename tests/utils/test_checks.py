"""The argument checks: the plain value back, or a TypeError (wrong type) or ValueError (out of
range) that names the argument and what was expected."""
import numpy as np
import pytest

from lightning_rnn.utils.checks import (
    check_callable, check_choice, check_file, check_flag, check_int, check_number, check_positive_number,
    check_probability, check_seed,
)


def test_check_int_returns_a_plain_int_within_its_bounds():
    assert check_int("n", np.int64(3), 1) == 3 and type(check_int("n", np.int64(3), 1)) is int
    assert check_int("n", None, 1, optional=True) is None
    assert check_int("rank", 1, 0, maximum=1) == 1
    for value, error, expected in [
        (0, ValueError, "n: expected an int >= 1, got 0"),
        (True, TypeError, "n: expected an int >= 1, got True"),
        (2.0, TypeError, "n: expected an int >= 1, got 2.0"),
        (None, TypeError, "n: expected an int >= 1, got None"),
    ]:
        with pytest.raises(error, match=expected):
            check_int("n", value, 1)
    with pytest.raises(ValueError, match=r"rank: expected an int in \[0, 1\], got 2"):
        check_int("rank", 2, 0, maximum=1)
    with pytest.raises(TypeError, match="n: expected None or an int >= 1, got '3'"):
        check_int("n", "3", 1, optional=True)


def test_check_number_takes_open_and_closed_bounds():
    assert check_number("f", 0.25, 0, 0.5, low_open=True, high_open=True) == 0.25
    assert check_number("t", 0, 0) == 0.0 and check_probability("p", 0.0) == 0.0
    assert check_positive_number("s", None, optional=True) is None
    for call, error, expected in [
        (lambda: check_number("f", 0.5, 0, 0.5, low_open=True, high_open=True), ValueError,
         r"f: expected a finite number in \(0, 0.5\), got 0.5"),
        (lambda: check_number("t", float("nan"), 0), ValueError, "t: expected a finite number >= 0, got nan"),
        (lambda: check_positive_number("s", 0), ValueError, "s: expected a finite number > 0, got 0"),
        (lambda: check_positive_number("s", float("inf")), ValueError, "s: expected a finite number > 0, got inf"),
        (lambda: check_positive_number("s", "1"), TypeError, "s: expected a finite number > 0, got '1'"),
        (lambda: check_positive_number("s", False), TypeError, "s: expected a finite number > 0, got False"),
        (lambda: check_probability("p", 1.0), ValueError, r"p: expected a finite number in \[0, 1\), got 1.0"),
    ]:
        with pytest.raises(error, match=expected):
            call()
    assert check_probability("p", 1.0, include_one=True) == 1.0


def test_check_flag_choice_callable_seed_and_file(tmp_path):
    assert check_flag("f", np.bool_(True)) is True and check_flag("f", 0) is False
    with pytest.raises(TypeError, match="f: expected a bool, got 'false'"):
        check_flag("f", "false")
    assert check_choice("c", "a", ("a", "b")) == "a"
    with pytest.raises(ValueError, match="c: expected one of 'a', 'b', got 'z'"):
        check_choice("c", "z", ("a", "b"))
    with pytest.raises(TypeError, match=r"c: expected one of 'a', 'b', got \['a'\]"):
        check_choice("c", ["a"], ("a", "b"))
    assert check_callable("f", len, "a function") is len and check_callable("f", None, "x", optional=True) is None
    with pytest.raises(TypeError, match="f: expected None or a factory f\\(x\\), got 3"):
        check_callable("f", 3, "a factory f(x)", optional=True)
    assert check_seed(np.int32(4)) == 4
    with pytest.raises(TypeError, match="seed: expected an int, got 1.5"):
        check_seed(1.5)
    (tmp_path / "a.txt").write_text("x")
    assert check_file("path", str(tmp_path / "a.txt")) == str(tmp_path / "a.txt")
    with pytest.raises(ValueError, match="path: no such file"):
        check_file("path", str(tmp_path / "b.txt"))
    assert check_file("path", None, optional=True) is None
