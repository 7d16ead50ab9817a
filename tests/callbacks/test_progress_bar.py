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


class Sequences(LightningModule):
    """A per-step linear model on (B, T) batches, optimized with SGD at lr 0.1 halved each step."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0].unsqueeze(-1)).sum()

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class SteppedClock:
    """perf_counter for the progress bar's module: training step k (from 1) takes k seconds."""

    def __init__(self):
        self.now, self.calls = 0.0, 0

    def perf_counter(self):
        self.calls += 1
        if self.calls % 2 == 0:  # the end of a step: its start was the call before
            self.now += self.calls // 2
        return self.now


def test_the_bar_shows_tokens_per_second_over_its_window_and_the_current_lr(monkeypatch):
    """4 steps of 2 x 5 tokens taking 1, 2, 3, 4 seconds; a window of 2 steps: 20 tokens in
    7 seconds. The lr is the optimizer's after the scheduler's 4 steps: 0.1 / 2**4."""
    from lightning_rnn.callbacks import progress_bar

    monkeypatch.setattr(progress_bar, "time", SteppedClock())
    bar = StepLimitedProgressBar(tokens_window=2)
    loader = DataLoader(TensorDataset(torch.randn(8, 5)), batch_size=2)
    trainer = Trainer(max_steps=4, callbacks=[bar], logger=False, enable_checkpointing=False,
                      enable_model_summary=False, limit_val_batches=0)
    trainer.fit(Sequences(), loader)
    metrics = bar.get_metrics(trainer, trainer.lightning_module)
    assert bar.tokens_per_second() == pytest.approx(20 / 7)
    assert metrics["tokens/s"] == "2.86"
    assert metrics["lr"] == "0.00625"
    assert bar.tokens_per_second(world_size=2) == pytest.approx(40 / 7)  # a DDP run's processes together
    texts = list(bar._metric_component._generate_metrics_texts())
    assert "tokens/s: 2.86" in texts and "lr: 0.00625" in texts


@pytest.mark.parametrize("value, text", [(0.5, "0.50"), (950, "950"), (12_345, "12.3k"), (1.5e6, "1.50M"),
                                         (3.2e9, "3.20G")])
def test_large_rates_are_shortened(value, text):
    from lightning_rnn.callbacks.progress_bar import short_number

    assert short_number(value) == text


def test_log_lines_written_while_the_bar_is_drawn_go_above_it(tmp_path):
    """In a terminal the bar redirects stdout through its console; a logging handler that
    holds the stream it had before would write into the middle of the bar's lines."""
    import io
    import logging
    import sys

    terminal = io.StringIO()
    handler = logging.StreamHandler(sys.stdout)  # as Hydra's console handler holds it
    root = logging.getLogger()
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.INFO)

    class Logs(Linear):
        def validation_step(self, batch, batch_idx):
            logging.getLogger("lightning_rnn.test").info("a line during validation")
            super().validation_step(batch, batch_idx)

    bar = StepLimitedProgressBar(console_kwargs={"file": terminal, "force_terminal": True, "width": 80})
    loader = DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2)
    try:
        stream = handler.stream
        trainer = Trainer(max_steps=2, callbacks=[bar], logger=False, enable_checkpointing=False,
                          enable_model_summary=False, limit_val_batches=1, val_check_interval=2)
        trainer.fit(Logs(), loader, loader)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    assert "a line during validation" in terminal.getvalue()  # printed by the bar's console
    assert handler.stream is stream  # and the handler's own stream back after the run
