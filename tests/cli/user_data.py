"""A data module of a user's own project: a plain LightningDataModule (no model_kwargs)."""
import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from lightning_rnn.data import DictDataset


class PlainSequenceData(pl.LightningDataModule):
    """Fixed-length (B, T, features) float sequences with a class id each."""

    def __init__(self, num_features: int = 2, steps: int = 6):
        super().__init__()
        self.num_features, self.steps = num_features, steps

    def setup(self, stage=None):
        inputs = torch.randn(16, self.steps, self.num_features)
        self.dataset = DictDataset(inputs=inputs, targets=(inputs[:, :, 0].sum(1) > 0).long())

    def train_dataloader(self):
        return DataLoader(self.dataset, batch_size=4, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.dataset, batch_size=4)
