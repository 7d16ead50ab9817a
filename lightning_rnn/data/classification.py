"""Variable-length sequence classification: a CSV/JSONL file or a synthetic default."""
from __future__ import annotations

import csv
import io
import json
import math
import re
from pathlib import Path

import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import Dataset, random_split

from ..utils.checks import check_file, check_int, check_seed
from .base import RNNDataModule, read_text_file, split_sizes


class SequenceListDataset(Dataset):
    """Item ``i``: ``{"inputs": (T_i, F) float32, "targets": () int64}``."""

    def __init__(self, sequences: list[torch.Tensor], labels: torch.Tensor):
        if len(sequences) != len(labels):
            raise ValueError(f"labels: expected {len(sequences)} labels, one per sequence, got {len(labels)}")
        self.sequences, self.labels = sequences, labels

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"inputs": self.sequences[index], "targets": self.labels[index]}


def pad_batch(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Collate variable-length items into ``inputs`` (B, T_max, F) zero-padded,
    ``lengths`` (B,) int64 and ``targets`` (B,)."""
    sequences = [item["inputs"] for item in items]
    return {
        "inputs": pad_sequence(sequences, batch_first=True),
        "lengths": torch.tensor([len(s) for s in sequences], dtype=torch.long),
        "targets": torch.stack([item["targets"] for item in items]),
    }


def sine_frequencies(num_samples: int, num_classes: int, min_len: int, max_len: int,
                     generator: torch.Generator) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Noisy sines whose class is their frequency (``num_classes`` frequencies in [0.02, 0.2]
    cycles per step), random phase, lengths uniform in [min_len, max_len].

    Returns:
        ``num_samples`` tensors of shape (T_i, 1) and their labels (num_samples,) int64.
    """
    labels = torch.randint(0, num_classes, (num_samples,), generator=generator)
    lengths = torch.randint(min_len, max_len + 1, (num_samples,), generator=generator)
    frequencies = torch.linspace(0.02, 0.2, num_classes)
    sequences = []
    for label, length in zip(labels.tolist(), lengths.tolist()):
        phase = torch.rand((), generator=generator) * 2 * math.pi
        t = torch.arange(length, dtype=torch.float32)
        wave = torch.sin(2 * math.pi * frequencies[label] * t + phase)
        sequences.append((wave + 0.3 * torch.randn(length, generator=generator)).unsqueeze(-1))
    return sequences, labels


def read_sequences(path: Path) -> tuple[list[torch.Tensor], list[str]]:
    """Sequences and raw labels from a file.

    - ``.jsonl``: one object per line, ``{"sequence": [...], "label": ...}``; a sequence is a
      list of numbers (one feature) or of equally long lists (several features).
    - ``.csv``: columns ``sequence`` (numbers separated by spaces) and ``label``.
    """
    if path.suffix == ".jsonl":
        rows = []
        for number, line in enumerate(read_text_file(path).splitlines(), start=1):
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise ValueError(f"path: line {number} of {path.name} is not JSON ({err.msg})") from None
                if not isinstance(row, dict):
                    raise ValueError(f"path: line {number} of {path.name} is not a JSON object "
                                     f'{{"sequence": [...], "label": ...}} (got {type(row).__name__})')
                rows.append(row)
    elif path.suffix == ".csv":
        rows = list(csv.DictReader(io.StringIO(read_text_file(path, newline=""), newline="")))
    else:
        raise ValueError(f"path: expected a .csv or .jsonl file, got {str(path)!r}")
    if not rows:
        raise ValueError(f"path: {path} holds no records (expected one per sequence, with 'sequence' and 'label')")
    for number, row in enumerate(rows, start=1):
        missing = [key for key in ("sequence", "label") if key not in row]
        if missing:
            raise ValueError(f"path: row {number} of {path.name} has no {' or '.join(map(repr, missing))} "
                             f"(expected the keys 'sequence' and 'label', got {sorted(row)})")
    values = (lambda text: [float(v) for v in text.split()]) if path.suffix == ".csv" else (lambda seq: seq)
    sequences, labels = [], []
    for line, row in enumerate(rows, start=1):
        try:
            tensor = torch.tensor(values(row["sequence"]), dtype=torch.float32)
        except (ValueError, TypeError) as err:
            raise ValueError(
                f"path: record {line} of {path.name}: 'sequence' is not numbers, or lists of numbers of one "
                f"length ({err})"
            ) from None
        label = row["label"]
        if label is None or (isinstance(label, str) and not label.strip()):
            raise ValueError(f"path: record {line} of {path.name} has no label")
        labels.append(label_name(label))
        if not torch.isfinite(tensor).all():
            raise ValueError(f"path: record {line} of {path.name} has a value that is not a finite number "
                             "(nan or inf) in its 'sequence'")
        if tensor.dim() == 1:
            tensor = tensor.unsqueeze(-1)
        if tensor.dim() != 2 or len(tensor) == 0:
            raise ValueError(f"path: record {line} of {path.name} has no steps or an irregular shape")
        if sequences and tensor.shape[1] != sequences[0].shape[1]:
            raise ValueError(f"path: record {line} of {path.name} has {tensor.shape[1]} features per step, "
                             f"record 1 has {sequences[0].shape[1]}")
        sequences.append(tensor)
    return sequences, labels


def label_name(label) -> str:
    """A label as the text its class is named by: a whole number written as a float (1.0,
    "1.0", as float exports write them) as that number ("1"), so it joins its class."""
    if isinstance(label, float) and label.is_integer():
        return str(int(label))
    text = str(label).strip()
    if re.fullmatch(r"[-+]?\d+\.0*", text):
        return str(int(float(text)))
    return text


def _label_order(label: str) -> tuple:
    """Numbers in numeric order ("2" before "10"), then other labels as text ("nan" too:
    it has no place among numbers)."""
    try:
        value = float(label)
    except ValueError:
        return (1, 0.0, label)
    return (1, 0.0, label) if math.isnan(value) else (0, value, label)


class SequenceClassificationDataModule(RNNDataModule):
    """Variable-length sequences with one label each, batched padded with ``lengths``
    (the classifier packs them; the ``PackedSequences`` callback may bucket them).

    Args:
        path: a ``.csv`` or ``.jsonl`` file (see :func:`read_sequences`); labels are mapped
            to ids in sorted order (numeric labels by value: "2" before "10"). If None,
            synthetic :func:`sine_frequencies` data.
        num_samples, num_classes, min_len, max_len: size of the synthetic data.
        val_fraction, test_fraction: random held-out parts (seeded by ``seed``).
    """

    collate_fn = staticmethod(pad_batch)

    def __init__(self, path: str | None = None, num_samples: int = 2000, num_classes: int = 4, min_len: int = 10,
                 max_len: int = 200, batch_size: int = 32, val_fraction: float = 0.1, test_fraction: float = 0.1,
                 seed: int = 0, num_workers: int = 0):
        super().__init__(batch_size=batch_size, num_workers=num_workers)
        self.path = check_file("path", path, optional=True)
        self.num_samples = check_int("num_samples", num_samples, 1)
        self.num_classes = check_int("num_classes", num_classes, 1)
        self.min_len = check_int("min_len", min_len, 1)
        self.max_len = check_int("max_len", max_len, self.min_len)  # min_len <= max_len
        self.fractions = (val_fraction, test_fraction)
        split_sizes(1, *self.fractions)
        self.seed = check_seed(seed)
        self.classes: list[str] = []
        self.num_features: int | None = None  # known after setup

    def build_datasets(self) -> dict:
        generator = torch.Generator().manual_seed(self.seed)
        if self.path is None:
            sequences, labels = sine_frequencies(self.num_samples, self.num_classes, self.min_len, self.max_len,
                                                 generator)
            self.classes = [str(i) for i in range(self.num_classes)]
        else:
            sequences, raw_labels = read_sequences(Path(self.path))
            self.classes = sorted(set(raw_labels), key=_label_order)
            if len(self.classes) < 2:
                raise ValueError(f"path: every record of {Path(self.path).name} has the label {self.classes[0]!r}; "
                                 "a classifier needs at least 2 classes")
            labels = torch.tensor([self.classes.index(label) for label in raw_labels])
            self.num_classes = len(self.classes)
        self.num_features = sequences[0].shape[-1]
        dataset = SequenceListDataset(sequences, labels)
        parts = random_split(dataset, split_sizes(len(dataset), *self.fractions), generator=generator)
        return dict(zip(("train", "val", "test"), parts))

    def model_kwargs(self) -> dict:
        return {"input_size": self.num_features, "num_classes": self.num_classes}

    def _dataloader(self, split: str):
        if split != "train" and len(self.datasets[split]) == 0:
            total = sum(len(part) for part in self.datasets.values())
            fraction = self.fractions[0 if split == "val" else 1]
            raise ValueError(
                f"{split}_fraction: {fraction} of {total} sequences leaves the {split} split empty; "
                f"use more data or a larger {split}_fraction"
            )
        return super()._dataloader(split)
