"""StepLimitedProgressBar: the training bar's label in runs with and without an epoch limit,
and the logger version it shows."""
import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

from lightning_rnn.callbacks import StepLimitedProgressBar


class Linear(LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).sum()

    def validation_step(self, batch, batch_idx):
        self.log("val/sum", self.layer(batch[0]).sum())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("max_epochs, label", [(-1, "Epoch 1"), (3, "Epoch 1/2")])
def test_the_training_bar_names_the_epoch_limit_only_where_there_is_one(max_epochs, label):
    """6 steps of 4 batches: the bar ends in epoch 1. Lightning's own bar reads "Epoch 1/-2"
    with max_epochs=-1 (training limited by max_steps, as the recipes are)."""
    bar = StepLimitedProgressBar()
    loader = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2)
    trainer = Trainer(max_steps=6, max_epochs=max_epochs, callbacks=[bar], logger=False,
                      enable_checkpointing=False, enable_model_summary=False)
    trainer.fit(Linear(), loader, loader)
    assert bar.progress.tasks[bar.train_progress_bar_id].description.rstrip() == label


def test_the_logger_version_shows_as_an_integer(tmp_path):
    """Lightning's rich bar formats numbers as floats: a CSV logger's version 0 read 'v_num: 0.000'."""
    bar = StepLimitedProgressBar()
    loader = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2)
    trainer = Trainer(max_steps=2, callbacks=[bar], logger=CSVLogger(tmp_path), enable_checkpointing=False,
                      enable_model_summary=False, limit_val_batches=0)
    trainer.fit(Linear(), loader)
    metrics = bar.get_metrics(trainer, trainer.lightning_module)
    assert metrics["v_num"] == "0"
    texts = list(bar._metric_component._generate_metrics_texts())
    assert "v_num: 0" in texts
