"""Argument checks shared by the layers, modules, data modules and callbacks: each returns
the value in its plain Python type or raises an error that names the argument."""
from __future__ import annotations

import math
import numbers


def check_int(name: str, value, minimum: int) -> int:
    """An int (Python or numpy, not a bool) >= ``minimum``; a TypeError for another type,
    a ValueError for a smaller int."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an int >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value!r}")
    return int(value)


def check_flag(name: str, value) -> bool:
    """A bool, 0 or 1, or a numpy bool (a flag read from an array or a numpy-backed config);
    a TypeError for anything else (a string such as "false" is not read as True)."""
    numpy_bool = getattr(value, "dtype", None) == bool and getattr(value, "shape", None) == ()
    if not (isinstance(value, numbers.Integral) or numpy_bool) or value not in (0, 1):
        raise TypeError(f"{name}: expected a bool, got {value!r}")
    return bool(value)


def check_positive_number(name: str, value, optional: bool = False) -> float | None:
    """A finite real number > 0 (not a bool), or None where ``optional``; a ValueError
    naming ``name`` otherwise."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name}: expected {'None or ' if optional else ''}a finite number > 0, got {value!r}")
    return float(value)


def check_seed(value, optional: bool = False) -> int | None:
    """A random seed: an int (Python or numpy, not a bool), or None where ``optional``; a
    ValueError naming ``seed`` otherwise (torch's manual_seed names no argument)."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"seed: expected {'None or ' if optional else ''}an int, got {value!r}")
    return int(value)
