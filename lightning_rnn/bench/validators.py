"""The validators of the benchmark's configuration (:mod:`.config`): each returns the value
in its plain type or raises ValueError naming its key (e.g. ``bench.grid.hidden[1]``)."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from .implementations import parse_impl


def integer(key: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{key}: expected an int >= {minimum}, got {value!r}")
    return value


def optional_integer(key: str, value: Any, minimum: int = 1) -> int | None:
    return None if value is None else integer(key, value, minimum)


def number_in(key: str, value: Any, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < value <= high:
        raise ValueError(f"{key}: expected a number in ({low}, {high}], got {value!r}")
    return float(value)


def integers(key: str, value: Any, minimum: int = 1) -> list[int]:
    items = non_empty_list(key, value)
    return [integer(f"{key}[{i}]", v, minimum) for i, v in enumerate(items)]


def choices(key: str, value: Any, allowed: Sequence[str]) -> list[str]:
    items = non_empty_list(key, value)
    for i, v in enumerate(items):
        if v not in allowed:
            raise ValueError(f"{key}[{i}]: expected one of {', '.join(allowed)}, got {v!r}")
    if len(set(items)) != len(items):
        raise ValueError(f"{key}: duplicate entries in {items!r}")
    return list(items)


def implementation_names(key: str, value: Any, *, packed: bool = False, projected: bool = False) -> list[str]:
    """A list of implementation names (see :mod:`lightning_rnn.bench.implementations`)."""
    items = non_empty_list(key, value)
    for i, name in enumerate(items):
        spec = parse_impl(name, f"{key}[{i}]")
        if packed and spec.base == "naive":
            raise ValueError(f"{key}[{i}]: 'naive' cannot run packed (variable-length) batches")
        if projected and spec.base in ("naive", "gemm"):
            raise ValueError(f"{key}[{i}]: {spec.base!r} has no projection (proj_size); use ours or torch")
    if len(set(items)) != len(items):
        raise ValueError(f"{key}: duplicate entries in {items!r}")
    return items


def non_empty_list(key: str, value: Any) -> list:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) == 0:
        raise ValueError(f"{key}: expected a non-empty list, got {value!r}")
    return list(value)


def flag(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{key}: expected true or false, got {value!r}")
    return value


def from_mapping(cls, key: str, values: Mapping):
    """Build dataclass ``cls`` from a mapping, rejecting unknown keys by name."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names - {"_target_"})
    if unknown:
        raise ValueError(f"{key}.{unknown[0]}: unknown key (expected one of {', '.join(sorted(names))})")
    return cls(**{k: v for k, v in values.items() if k != "_target_"})


def section(cls, key: str, value: Any):
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        return from_mapping(cls, key, value)
    raise ValueError(f"{key}: expected a mapping, got {value!r}")
