"""Shared pieces of the data modules: dict datasets and the split/loader plumbing."""
from __future__ import annotations

from pathlib import Path

import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset

from ..utils.checks import check_int, check_number
from .streams import ResumableLoader, trainer_batches_done

SPLITS = ("train", "val", "test")


class DictDataset(Dataset):
    """Rows of equally long tensors, item ``i`` being ``{name: tensor[i]}``."""

    def __init__(self, **tensors: torch.Tensor):
        lengths = {name: len(t) for name, t in tensors.items()}
        if not tensors or len(set(lengths.values())) != 1:
            raise ValueError(f"tensors: expected one or more tensors of equal length, got lengths {lengths}")
        self.tensors = tensors

    def __len__(self) -> int:
        return len(next(iter(self.tensors.values())))

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {name: t[index] for name, t in self.tensors.items()}


def split_sizes(total: int, val_fraction: float, test_fraction: float) -> tuple[int, int, int]:
    """Sizes of contiguous train/val/test parts of ``total`` items."""
    for name, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        check_number(name, value, 0, 0.5, low_open=True, high_open=True)
    n_val, n_test = int(total * val_fraction), int(total * test_fraction)
    return total - n_val - n_test, n_val, n_test


class RNNDataModule(LightningDataModule):
    """Base of the data modules: ``setup`` fills ``self.datasets[split]``; batches are dicts
    with ``inputs`` and ``targets`` (and ``lengths`` for variable-length data).

    Subclasses implement :meth:`build_datasets` and :meth:`model_kwargs`, the constructor
    arguments a model takes from the data (e.g. ``vocab`` or ``input_size``).
    """

    collate_fn = None

    def __init__(self, batch_size: int = 32, num_workers: int = 0):
        super().__init__()
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.num_workers = check_int("num_workers", num_workers, 0)
        self.datasets: dict[str, Dataset] = {}

    def build_datasets(self) -> dict[str, Dataset]:
        """The train, val and test datasets."""
        raise NotImplementedError

    def model_kwargs(self) -> dict:
        """Constructor arguments the model needs from the data (call after ``setup``)."""
        raise NotImplementedError

    def setup(self, stage: str | None = None) -> None:
        if not self.datasets:
            self.datasets = self.build_datasets()

    def _dataloader(self, split: str) -> DataLoader:
        """The loader of ``split``; the train one shuffles, and a Lightning run resumes it exactly
        (the batches of an epoch it has not seen, in the order the uninterrupted run had: see
        :class:`~lightning_rnn.data.ResumableLoader`)."""
        kwargs = dict(batch_size=self.batch_size, num_workers=self.num_workers, collate_fn=self.collate_fn)
        if split != "train":
            return DataLoader(self.datasets[split], **kwargs)
        return ResumableLoader(self.datasets[split], shuffle=True, **kwargs,
                               batches_done=lambda: trainer_batches_done(self.trainer),
                               epoch=lambda: None if self.trainer is None else self.trainer.current_epoch)

    def train_dataloader(self) -> DataLoader:
        return self._dataloader("train")

    def val_dataloader(self) -> DataLoader:
        return self._dataloader("val")

    def test_dataloader(self) -> DataLoader:
        return self._dataloader("test")

    def predict_dataloader(self) -> DataLoader:
        """``Trainer.predict`` runs on the test split (in order)."""
        return self._dataloader("test")


def read_text_file(path: str | Path, newline: str | None = None) -> str:
    """The text of a data file: UTF-8, a leading byte-order mark (spreadsheets write one)
    dropped, or a ValueError naming ``path``. ``newline`` as for ``open`` ("" keeps \\r\\n
    for the csv module; None reads every line end as \\n)."""
    try:
        with open(path, encoding="utf-8-sig", newline=newline) as f:
            return f.read()
    except UnicodeDecodeError as err:
        raise ValueError(f"path: {path} is not UTF-8 text ({err.reason} at byte {err.start})") from None
