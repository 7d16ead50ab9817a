"""LossPlot: the training and validation loss against wall-clock time, a PNG written when fit
ends (and when it stops on an error)."""
import logging

import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from matplotlib.image import imread
from torch.utils.data import DataLoader, TensorDataset

from lightning_rnn.callbacks import LossPlot


class Regression(LightningModule):
    """Logs train/loss every step and val/loss every validation, and keeps what it logged."""

    def __init__(self, fail_at_step=None):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.fail_at_step = fail_at_step
        self.val_logged = []

    def training_step(self, batch, batch_idx):
        if self.global_step == self.fail_at_step:
            raise RuntimeError("stopped on purpose")
        loss = self.layer(batch[0]).pow(2).mean()
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", self.layer(batch[0]).pow(2).mean())

    def on_validation_epoch_end(self):
        if not self.trainer.sanity_checking:
            self.val_logged.append(float(self.trainer.callback_metrics["val/loss"]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(module, plot, root, max_steps=6):
    loader = DataLoader(TensorDataset(torch.randn(16, 2)), batch_size=2)
    trainer = Trainer(max_steps=max_steps, callbacks=[plot], logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, val_check_interval=2,
                      limit_val_batches=1, log_every_n_steps=1, num_sanity_val_steps=1, default_root_dir=root)
    trainer.fit(module, loader, loader)


def test_the_plot_is_a_png_of_every_logged_loss_against_time(tmp_path):
    plot, module = LossPlot(tmp_path / "run" / "loss.png"), Regression()
    fit(module, plot, tmp_path)
    image = imread(tmp_path / "run" / "loss.png")
    assert image.ndim == 3 and image.shape[:2] == (450, 700)  # 7 x 4.5 inches at 100 dpi
    assert image[..., :3].std() > 0.05  # something is drawn on the white
    assert len(plot.train) == 6
    assert [v for _, v in plot.val] == pytest.approx(module.val_logged) and len(plot.val) == 3  # not the sanity check
    times = [t for t, _ in sorted(plot.train + plot.val)]
    assert times[0] >= 0 and times == sorted(times)


def test_it_goes_to_the_trainers_directory_unless_told(tmp_path):
    fit(Regression(), LossPlot(), tmp_path, max_steps=2)
    assert imread(tmp_path / "loss.png").shape[:2] == (450, 700)


def test_a_run_stopped_by_an_error_is_plotted_up_to_where_it_stopped(tmp_path):
    plot = LossPlot(tmp_path / "loss.png")
    with pytest.raises(RuntimeError, match="on purpose"):
        fit(Regression(fail_at_step=3), plot, tmp_path)
    assert len(plot.train) == 3 and len(plot.val) == 1
    assert (tmp_path / "loss.png").is_file()


def test_nothing_logged_writes_nothing_and_says_so(tmp_path, caplog):
    plot = LossPlot(tmp_path / "loss.png", train_key="train/nll", val_key="val/nll")
    with caplog.at_level(logging.WARNING, logger="lightning_rnn.callbacks.loss_plot"):
        fit(Regression(), plot, tmp_path, max_steps=2)
    assert not (tmp_path / "loss.png").exists()
    assert "train/nll and val/nll were never logged" in caplog.text
