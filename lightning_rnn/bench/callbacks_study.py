"""The model and data of the PackedSequences epoch-time study (callbacks_bench)."""
from __future__ import annotations

import torch
from lightning.pytorch import LightningModule
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pad_sequence
from torch.utils.data import DataLoader

from ..layers import FusedLSTM

FEATURES = 8


class LengthClassifier(LightningModule):
    """FusedLSTM over padded (B, T, 8) or packed inputs; its state at each sequence's end -> 2 classes.

    Padded batches run the whole padded tensor; the loss is the same function either way.
    """

    def __init__(self, hidden: int = 128, backend: str = "auto"):
        super().__init__()
        self.rnn = FusedLSTM(FEATURES, hidden, batch_first=True, backend=backend)
        self.head = nn.Linear(hidden, 2)
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        inputs, lengths = batch["inputs"], batch["lengths"]
        if isinstance(inputs, PackedSequence):
            last = self.rnn(inputs)[1][0][-1]  # (B, H) state at each sequence's last step
        else:
            last = self.rnn(inputs)[0][torch.arange(len(lengths)), lengths - 1]
        loss = nn.functional.cross_entropy(self.head(last), batch["targets"])
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def _collate(items):
    sequences = [item["inputs"] for item in items]
    return {
        "inputs": pad_sequence(sequences, batch_first=True),
        "lengths": torch.tensor([len(x) for x in sequences]),
        "targets": torch.stack([item["targets"] for item in items]),
    }


def variable_length_loader(num: int, min_len: int, max_len: int, batch_size: int, seed: int = 0) -> DataLoader:
    """Random (L, 8) sequences, L uniform in [min_len, max_len]; label: the sign of the first
    feature at the last step (learnable within one epoch: the loss falls from ln 2 ~ 0.69 to
    about 0.6, so padded and packed runs can be compared step by step)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (num,), generator=g)
    data = []
    for L in lengths.tolist():
        x = torch.randn(L, FEATURES, generator=g)
        data.append({"inputs": x, "targets": (x[-1, 0] > 0).long()})
    order = torch.Generator().manual_seed(seed)
    return DataLoader(data, batch_size=batch_size, shuffle=True, collate_fn=_collate, generator=order)
