"""Argument checks shared by the whole package, one helper per kind of argument.

Each returns the value in its plain Python type or raises an error that names the argument
and what was expected: a TypeError for a value of the wrong type, a ValueError for a value
of the right type that is out of range (or not one of the choices).
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Collection
from pathlib import Path


def _expected(description: str, optional: bool) -> str:
    return f"None or {description}" if optional else description


def _range(kind: str, low, high, low_open: bool = False, high_open: bool = False) -> str:
    """``"an int >= 1"``, ``"a number in (0, 0.5)"``, ``"a finite number"``, ..."""
    if low is not None and high is not None:
        return f"{kind} in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    if low is not None:
        return f"{kind} {'>' if low_open else '>='} {low}"
    if high is not None:
        return f"{kind} {'<' if high_open else '<='} {high}"
    return kind


def check_int(name: str, value, minimum: int | None = None, *, maximum: int | None = None,
              optional: bool = False) -> int | None:
    """An int (Python or numpy, not a bool) in ``[minimum, maximum]`` (a bound of None is
    open), or None where ``optional``."""
    if value is None and optional:
        return None
    expected = _expected(_range("an int", minimum, maximum), optional)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected {expected}, got {value!r}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f"{name}: expected {expected}, got {value!r}")
    return int(value)


def check_number(name: str, value, low: float | None = None, high: float | None = None, *, low_open: bool = False,
                 high_open: bool = False, optional: bool = False) -> float | None:
    """A finite real number (not a bool) between ``low`` and ``high`` (each bound inclusive
    unless ``*_open``; None: unbounded), or None where ``optional``."""
    if value is None and optional:
        return None
    expected = _expected(_range("a finite number", low, high, low_open, high_open), optional)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected {expected}, got {value!r}")
    below = low is not None and (value <= low if low_open else value < low)
    above = high is not None and (value >= high if high_open else value > high)
    if not math.isfinite(value) or below or above:
        raise ValueError(f"{name}: expected {expected}, got {value!r}")
    return float(value)


def check_positive_number(name: str, value, optional: bool = False) -> float | None:
    """A finite real number > 0, or None where ``optional``."""
    return check_number(name, value, 0, low_open=True, optional=optional)


def check_probability(name: str, value, *, include_one: bool = False) -> float:
    """A probability in [0, 1) (a dropout rate: 1 would drop everything), or [0, 1]."""
    return check_number(name, value, 0, 1, high_open=not include_one)


def check_flag(name: str, value) -> bool:
    """A bool, 0 or 1, or a numpy bool (a flag read from an array or a numpy-backed config);
    a TypeError for anything else (a string such as "false" is not read as True)."""
    numpy_bool = getattr(value, "dtype", None) == bool and getattr(value, "shape", None) == ()
    if not (isinstance(value, numbers.Integral) or numpy_bool) or value not in (0, 1):
        raise TypeError(f"{name}: expected a bool, got {value!r}")
    return bool(value)


def check_choice(name: str, value, choices: Collection):
    """One of ``choices``; a TypeError where the choices are strings and ``value`` is not one."""
    expected = f"one of {', '.join(map(repr, choices))}"
    if all(isinstance(c, str) for c in choices) and not isinstance(value, str):
        raise TypeError(f"{name}: expected {expected}, got {value!r}")
    if value not in choices:
        raise ValueError(f"{name}: expected {expected}, got {value!r}")
    return value


def check_callable(name: str, value, expected: str, optional: bool = False):
    """A callable (``expected`` says which, e.g. "a factory optimizer(params)"), or None
    where ``optional``; a TypeError otherwise."""
    if (value is None and optional) or callable(value):
        return value
    raise TypeError(f"{name}: expected {_expected(expected, optional)}, got {value!r}")


def check_seed(value, optional: bool = False) -> int | None:
    """A random seed: an int, or None where ``optional`` (torch's manual_seed names no argument)."""
    return check_int("seed", value, optional=optional)


def check_file(name: str, path, optional: bool = False) -> str | None:
    """The path of an existing file, or None where ``optional``; a ValueError naming ``name``
    for a path that is not a file, a TypeError for a value that is not a path."""
    if path is None and optional:
        return None
    if not isinstance(path, (str, Path)):
        raise TypeError(f"{name}: expected {_expected('a file path', optional)}, got {path!r}")
    if not Path(path).is_file():
        raise ValueError(f"{name}: no such file {str(path)!r}")
    return path
