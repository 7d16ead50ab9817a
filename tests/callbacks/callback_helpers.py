"""A tiny model, variable-length data and an in-memory logger for the callback tests."""
from __future__ import annotations

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.loggers import Logger
from torch import nn
from torch.nn.utils.rnn import PackedSequence
from torch.utils.data import DataLoader, Dataset

from lightning_rnn import FusedLSTM

INPUT, HIDDEN, CLASSES = 3, 16, 2


class MemoryLogger(Logger):
    """Keeps every logged metric: ``history[name] == [(step, value), ...]``."""

    def __init__(self):
        super().__init__()
        self.history: dict[str, list[tuple[int, float]]] = {}

    @property
    def name(self):
        return "memory"

    @property
    def version(self):
        return 0

    def log_metrics(self, metrics, step=None):
        for k, v in metrics.items():
            self.history.setdefault(k, []).append((step, float(v)))

    def log_hyperparams(self, params, *args, **kwargs):
        pass

    def values(self, name: str) -> list[float]:
        return [v for _, v in self.history.get(name, [])]


class VariableLengthDataset(Dataset):
    """Sequences (L, INPUT) with L uniform in [min_len, max_len]; label: sign of the first feature's sum."""

    def __init__(self, n: int = 64, min_len: int = 2, max_len: int = 30, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.lengths = torch.randint(min_len, max_len + 1, (n,), generator=g)
        self.sequences = [torch.randn(int(L), INPUT, generator=g) for L in self.lengths]
        self.labels = torch.stack([(s[:, 0].sum() > 0).long() for s in self.sequences])

    def __len__(self):
        return len(self.sequences)

    def __getitem__(self, i):
        return {"inputs": self.sequences[i], "targets": self.labels[i]}


def pad_collate(items):
    seqs = [it["inputs"] for it in items]
    lengths = torch.tensor([len(s) for s in seqs])
    inputs = nn.utils.rnn.pad_sequence(seqs, batch_first=True)
    return {"inputs": inputs, "lengths": lengths, "targets": torch.stack([it["targets"] for it in items])}


def loader(n=64, batch_size=8, shuffle=True, **kw) -> DataLoader:
    return DataLoader(VariableLengthDataset(n, **kw), batch_size=batch_size, shuffle=shuffle, collate_fn=pad_collate)


class TinyClassifier(LightningModule):
    """FusedLSTM over padded or packed inputs, last state -> linear head.

    Padded batches run the full padded tensor (what a model without PackedSequences does)
    and read each sequence's output at its last real step.
    """

    def __init__(self, num_layers: int = 2, hidden: int = HIDDEN, lr: float = 0.05, dropout: float = 0.0):
        super().__init__()
        self.rnn = FusedLSTM(INPUT, hidden, num_layers, batch_first=True, dropout=dropout)
        self.head = nn.Linear(hidden, CLASSES)
        self.lr = lr
        self.seen: list[dict] = []  # what training_step saw, for assertions

    def features(self, inputs, lengths):
        if isinstance(inputs, PackedSequence):
            return self.rnn(inputs)[1][0][-1]  # h_n of the last layer, (B, H)
        out = self.rnn(inputs)[0]  # (B, T, H)
        return out[torch.arange(len(lengths)), lengths - 1]

    def training_step(self, batch, batch_idx):
        logits = self.head(self.features(batch["inputs"], batch["lengths"]))
        loss = nn.functional.cross_entropy(logits.float(), batch["targets"])
        self.seen.append({
            "packed": isinstance(batch["inputs"], PackedSequence),
            "lengths": batch["lengths"].clone(),
            "autocast": torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu"),
            "logits_dtype": logits.dtype,
            "chunk_size": getattr(self.rnn, "checkpoint_chunk_size", None),  # None for torch.nn's layers
        })
        self.log("train/loss", loss.detach(), batch_size=len(batch["lengths"]))
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def make_trainer(callbacks=(), max_steps: int = 4, **kwargs) -> tuple[Trainer, MemoryLogger]:
    logger = MemoryLogger()
    settings = dict(
        accelerator="cpu", devices=1, max_steps=max_steps, callbacks=list(callbacks), logger=logger,
        log_every_n_steps=1, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0,
    )
    trainer = Trainer(**{**settings, **kwargs})
    return trainer, logger
