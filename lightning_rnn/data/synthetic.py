"""Synthetic long-range tasks: the adding problem and the copy-memory task."""
from __future__ import annotations

import torch

from ..utils.checks import check_int, check_seed
from .base import SPLITS, DictDataset, RNNDataModule

#: Copy-memory symbols: id 0 is the blank, 1-8 the symbols to copy, 9 the delimiter.
COPY_MEMORY_VOCAB = "-ABCDEFGH:"


def adding_problem(num_samples: int, seq_len: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Hochreiter & Schmidhuber's adding problem.

    Returns:
        ``inputs`` (num_samples, seq_len, 2): channel 0 uniform in [0, 1), channel 1 marks
        one step in the first half and one in the second half; ``targets``
        (num_samples, 1, 1): the sum of the two marked values. Predicting the mean (1.0)
        scores an MSE of 1/6.
    """
    values = torch.rand(num_samples, seq_len, generator=generator)
    half = seq_len // 2
    first = torch.randint(0, half, (num_samples,), generator=generator)
    second = torch.randint(half, seq_len, (num_samples,), generator=generator)
    markers = torch.zeros(num_samples, seq_len)
    rows = torch.arange(num_samples)
    markers[rows, first] = 1.0
    markers[rows, second] = 1.0
    targets = (values * markers).sum(dim=1).view(num_samples, 1, 1)
    return {"inputs": torch.stack([values, markers], dim=-1), "targets": targets}


def copy_memory(num_samples: int, delay: int, num_symbols: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Arjovsky et al.'s copy-memory task (ids as in :data:`COPY_MEMORY_VOCAB`).

    The input is ``num_symbols`` random symbols, ``delay - 1`` blanks, the delimiter and
    ``num_symbols`` blanks; the target is blanks until the delimiter, then the symbols.

    Returns:
        ``inputs`` and ``targets``: (num_samples, delay + 2 * num_symbols) int64. Always
        predicting blanks until the delimiter, then uniformly, scores
        ``num_symbols * ln(8) / (delay + 2 * num_symbols)`` nats per step.
    """
    length = delay + 2 * num_symbols
    symbols = torch.randint(1, 9, (num_samples, num_symbols), generator=generator)
    inputs = torch.zeros(num_samples, length, dtype=torch.long)
    targets = torch.zeros(num_samples, length, dtype=torch.long)
    inputs[:, :num_symbols] = symbols
    inputs[:, delay + num_symbols - 1] = 9
    targets[:, -num_symbols:] = symbols
    return {"inputs": inputs, "targets": targets}


class _SyntheticDataModule(RNNDataModule):
    """Generates each split once, from its own seeded generator (3 * seed + split index, so
    that no two seeds share a split's data: seed 1's training set is not seed 0's test set)."""

    def __init__(self, num_train: int, num_val: int, num_test: int, batch_size: int, seed: int):
        super().__init__(batch_size=batch_size)
        self.sizes = {
            split: check_int(f"num_{split}", n, 1) for split, n in zip(SPLITS, (num_train, num_val, num_test))
        }
        self.seed = check_seed(seed)

    def generate(self, num_samples: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def build_datasets(self) -> dict:
        datasets = {}
        for offset, split in enumerate(SPLITS):
            generator = torch.Generator().manual_seed(len(SPLITS) * self.seed + offset)
            datasets[split] = DictDataset(**self.generate(self.sizes[split], generator))
        return datasets


class AddingProblemDataModule(_SyntheticDataModule):
    """The adding problem with sequences of ``seq_len`` steps (see :func:`adding_problem`)."""

    def __init__(self, seq_len: int = 1000, num_train: int = 10_000, num_val: int = 1000, num_test: int = 1000,
                 batch_size: int = 50, seed: int = 0):
        super().__init__(num_train, num_val, num_test, batch_size, seed)
        self.seq_len = check_int("seq_len", seq_len, 2)

    def generate(self, num_samples, generator):
        return adding_problem(num_samples, self.seq_len, generator)

    def model_kwargs(self) -> dict:
        return {"input_size": 2, "output_size": 1, "horizon": 1}


class CopyMemoryDataModule(_SyntheticDataModule):
    """The copy-memory task with a ``delay`` of blanks (see :func:`copy_memory`)."""

    def __init__(self, delay: int = 100, num_symbols: int = 10, num_train: int = 10_000, num_val: int = 1000,
                 num_test: int = 1000, batch_size: int = 50, seed: int = 0):
        super().__init__(num_train, num_val, num_test, batch_size, seed)
        self.delay = check_int("delay", delay, 1)
        self.num_symbols = check_int("num_symbols", num_symbols, 1)

    def generate(self, num_samples, generator):
        return copy_memory(num_samples, self.delay, self.num_symbols, generator)

    def model_kwargs(self) -> dict:
        return {"vocab": COPY_MEMORY_VOCAB}
