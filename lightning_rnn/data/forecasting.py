"""Multi-step time-series forecasting: a CSV file of numeric columns or a synthetic default."""
from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from pathlib import Path

import torch
from torch.utils.data import Dataset

from ..utils.checks import check_file, check_int, check_seed
from .base import RNNDataModule, read_text_file, split_sizes


class ForecastWindows(Dataset):
    """Sliding windows over a (time, features) series.

    Item ``i``: ``inputs`` = series[i : i + input_len] (input_len, F) and ``targets`` =
    series[i + input_len : i + input_len + horizon] (horizon, F).
    """

    def __init__(self, series: torch.Tensor, input_len: int, horizon: int):
        self.series, self.input_len, self.horizon = series, input_len, horizon
        if len(series) < input_len + horizon:
            raise ValueError(
                f"series: {len(series)} steps are too few for input_len={input_len} + horizon={horizon}"
            )

    def __len__(self) -> int:
        return len(self.series) - self.input_len - self.horizon + 1

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        end = index + self.input_len
        return {"inputs": self.series[index:end], "targets": self.series[end : end + self.horizon]}


def synthetic_series(num_steps: int, generator: torch.Generator) -> torch.Tensor:
    """Three noisy mixtures of daily (24), weekly (168) and 50-step cycles: (num_steps, 3)."""
    t = torch.arange(num_steps, dtype=torch.float32).unsqueeze(-1)
    periods = torch.tensor([24.0, 168.0, 50.0])
    mixing = torch.tensor([[1.0, 0.5, 0.0], [0.3, 1.0, 0.5], [0.0, 0.4, 1.0]])
    waves = torch.sin(2 * math.pi * t / periods) @ mixing
    return waves + 0.1 * torch.randn(num_steps, 3, generator=generator)


def read_series(path: Path, columns: list[str] | None) -> torch.Tensor:
    """The numeric ``columns`` (a name or a list; default: all) of a CSV file with a header, as (time, F)."""
    reader = csv.DictReader(io.StringIO(read_text_file(path, newline=""), newline=""))
    header = reader.fieldnames
    if not header:
        raise ValueError(f"path: {path} is empty (expected a header of column names, then rows of numbers)")
    repeated = sorted({name for name in header if header.count(name) > 1})
    if repeated:
        raise ValueError(f"path: the header of {path.name} names {', '.join(map(repr, repeated))} more than once")
    if isinstance(columns, str):  # data.columns=temp: one column, not its letters
        columns = [columns]
    names = list(columns) if columns is not None else list(header)
    missing = sorted(set(names) - set(header))
    if missing or not names:
        raise ValueError(f"columns: {missing or names} not found in the header of {path} ({header})")
    rows = []
    for row in reader:
        values = []
        for name in names:
            try:
                value = float(row[name])
            except (ValueError, TypeError):  # TypeError: a short row's missing fields are None
                value = None
            if value is None or not math.isfinite(value):
                raise ValueError(f"path: line {reader.line_num} of {path.name}, column {name!r}: "
                                 f"expected a finite number, got {row[name]!r}")
            values.append(value)
        rows.append(values)
    if not rows:
        raise ValueError(f"path: {path} has a header but no rows of values")
    return torch.tensor(rows, dtype=torch.float32)


class ForecastingDataModule(RNNDataModule):
    """Forecast the next ``horizon`` steps of every feature from the last ``input_len``.

    The series is split chronologically (train, then val, then test) and standardized
    with the training part's mean and standard deviation, so losses are in units of
    training standard deviations (a feature constant over the training part keeps a std
    of 1: it is only centered); after ``setup``, ``mean`` and ``std`` hold them and
    :meth:`to_data_units` maps predictions back to the data's units.

    Args:
        path: a CSV file with a header; ``columns`` picks the features (default: all).
            If None, :func:`synthetic_series` with ``num_steps`` steps.
    """

    def __init__(self, path: str | None = None, columns: list[str] | None = None, num_steps: int = 10_000,
                 input_len: int = 96, horizon: int = 24, batch_size: int = 64, val_fraction: float = 0.15,
                 test_fraction: float = 0.15, seed: int = 0, num_workers: int = 0):
        super().__init__(batch_size=batch_size, num_workers=num_workers)
        check_file("path", path, optional=True)
        if columns is not None and not isinstance(columns, str) and (
                not isinstance(columns, Sequence) or not all(isinstance(c, str) for c in columns)):
            raise TypeError(f"columns: expected None, a column name or a list of names, got {columns!r}")
        self.path, self.columns, self.seed = path, columns, check_seed(seed)
        self.num_steps = check_int("num_steps", num_steps, 1)
        self.input_len = check_int("input_len", input_len, 1)
        self.horizon = check_int("horizon", horizon, 1)
        self.fractions = (val_fraction, test_fraction)
        split_sizes(1, *self.fractions)
        self.num_features: int | None = None  # known after setup
        self.mean: torch.Tensor | None = None  # (F,) the training part's, after setup
        self.std: torch.Tensor | None = None

    def to_data_units(self, standardized: torch.Tensor) -> torch.Tensor:
        """Predictions (or targets) of shape (..., F) from training-std units back to the data's."""
        if self.mean is None:
            raise RuntimeError("to_data_units: call setup() first (the training part's statistics come from it)")
        return standardized * self.std.to(standardized) + self.mean.to(standardized)

    def build_datasets(self) -> dict:
        if self.path is None:
            series = synthetic_series(self.num_steps, torch.Generator().manual_seed(self.seed))
        else:
            series = read_series(Path(self.path), self.columns)
        self.num_features = series.shape[1]
        n_train, n_val, _ = split_sizes(len(series), *self.fractions)
        train = series[:n_train]
        # a feature constant over the training part is only centered: divided by a clamped,
        # tiny std, its later values would reach 1e8
        std = train.std(0)
        self.mean, self.std = train.mean(0), torch.where(std > 1e-8, std, torch.ones_like(std))
        series = (series - self.mean) / self.std
        parts = {"train": series[:n_train], "val": series[n_train : n_train + n_val],
                 "test": series[n_train + n_val :]}
        need = self.input_len + self.horizon
        for split, part in parts.items():
            if len(part) < need:
                raise ValueError(
                    f"series: the {split} split has {len(part)} of {len(series)} steps, too few for one window of "
                    f"input_len={self.input_len} + horizon={self.horizon}; use a longer series, a shorter window "
                    f"or larger val_fraction/test_fraction (now {self.fractions[0]}/{self.fractions[1]})"
                )
        return {split: ForecastWindows(part, self.input_len, self.horizon) for split, part in parts.items()}

    def model_kwargs(self) -> dict:
        return {"input_size": self.num_features, "output_size": self.num_features, "horizon": self.horizon}
