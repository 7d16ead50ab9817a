"""The Lightning internals lightning_rnn.utils.compat relies on: each test fails when a
Lightning release changes the behaviour the package depends on."""
import io

import lightning.pytorch as pl
import pytest
import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, TensorDataset

from lightning_rnn.data import LengthBucketBatchSampler
from lightning_rnn.utils import compat


class Linear(pl.LightningModule):
    """One weight; logs ``value`` without a batch size at every training step."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)

    def training_step(self, batch, batch_idx):
        (x,) = batch
        self.log("value", x.sum(), on_step=False, on_epoch=True)
        return self.layer(x).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def trainer(**kwargs):
    return pl.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, **kwargs)


def loader():
    return DataLoader(TensorDataset(torch.arange(1.0, 7.0).view(6, 1)), batch_size=2)


class AtSetup(pl.Callback):
    def setup(self, trainer, module, stage):
        self.source = compat.train_dataloader_source(trainer)


def test_the_train_dataloader_source_is_the_hook_or_the_loader_given_to_fit():
    given, spy = loader(), AtSetup()
    trainer(callbacks=[spy]).fit(Linear(), given)
    assert not spy.source.is_module() and spy.source.instance is given

    data = pl.LightningDataModule.from_datasets(train_dataset=TensorDataset(torch.ones(4, 1)), batch_size=2)
    trainer(callbacks=[spy]).fit(Linear(), datamodule=data)
    assert spy.source.is_module() and spy.source.instance is data and spy.source.name == "train_dataloader"


def test_a_bucketing_loader_made_while_recording_is_re_created_around_a_distributed_sampler():
    """What Lightning does to a train loader under DDP (_update_dataloader)."""
    from lightning.pytorch.utilities.data import _update_dataloader

    dataset = TensorDataset(torch.ones(8, 1))
    with compat.recording_loader_arguments():
        bucketing = DataLoader(dataset, batch_sampler=LengthBucketBatchSampler(
            RandomSampler(dataset), 2, False, lengths=torch.arange(8), bucket_size=4))
    shard = DistributedSampler(dataset, num_replicas=2, rank=1, shuffle=True)
    copy = _update_dataloader(bucketing, shard)
    assert isinstance(copy.batch_sampler, LengthBucketBatchSampler) and copy.batch_sampler.sampler is shard
    assert copy.batch_sampler.bucket_size == 4 and len(list(copy)) == 2
    with pytest.raises(Exception):  # unrecorded: Lightning cannot pass it the lengths
        _update_dataloader(DataLoader(dataset, batch_sampler=LengthBucketBatchSampler(
            RandomSampler(dataset), 2, False, lengths=torch.arange(8))), shard)


def test_the_logged_batch_size_weighs_the_epoch_mean():
    """Batches of x = (1, 2), (3, 4), (5, 6) log their sums 3, 7, 11; counted as batches of
    1, 2 and 3 the epoch mean is (3 + 14 + 33) / 6."""
    class Sizes(pl.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            compat.set_logged_batch_size(trainer, batch_idx + 1)

    t = trainer(callbacks=[Sizes()])
    t.fit(Linear(), loader())
    assert t.callback_metrics["value"].item() == pytest.approx(50 / 6)


def test_the_checkpoint_reader_takes_paths_and_file_objects_and_applies_weights_only(tmp_path):
    torch.save({"state_dict": {"w": torch.ones(2)}}, tmp_path / "plain.ckpt")
    assert torch.equal(compat.load_checkpoint_file(tmp_path / "plain.ckpt", True)["state_dict"]["w"], torch.ones(2))
    buffer = io.BytesIO((tmp_path / "plain.ckpt").read_bytes())
    assert "state_dict" in compat.load_checkpoint_file(buffer, True)
    torch.save({"object": io.StringIO}, tmp_path / "pickled.ckpt")  # a class: only the unpickler reads it
    with pytest.raises(Exception, match="weights_only"):
        compat.load_checkpoint_file(tmp_path / "pickled.ckpt", True)
    assert compat.load_checkpoint_file(tmp_path / "pickled.ckpt", False)["object"] is io.StringIO


class ManualFromSetup(Linear):
    """Automatic until setup, manual from there: the Trainer's clipping is allowed."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def configure_callbacks(self):
        self.automatic_optimization = True
        return []

    def setup(self, stage):
        compat.switch_to_manual_optimization(self)

    def training_step(self, batch, batch_idx):
        self.seen.append(self.automatic_optimization)
        optimizer = self.optimizers()
        self.manual_backward(self.layer(batch[0]).sum())
        optimizer.step()
        optimizer.zero_grad()


def test_lightning_checks_manual_optimization_s_trainer_flags_before_setup():
    with pytest.raises(MisconfigurationException, match="gradient clipping is not supported for manual"):
        module = Linear()
        module.automatic_optimization = False
        trainer(gradient_clip_val=1.0).fit(module, loader())
    module = ManualFromSetup()
    for _ in range(2):  # and again: configure_callbacks comes before the check in every run
        t = trainer(gradient_clip_val=1.0, accumulate_grad_batches=2)
        t.fit(module, loader())
        assert t.global_step == 3  # one step per batch: Lightning leaves the optimization to the module
    assert module.seen == [False] * 6


@pytest.mark.parametrize("skip", [False, True])
def test_a_module_whose_hyperparameter_logging_is_skipped_logs_none(tmp_path, skip):
    from lightning.pytorch.loggers import CSVLogger

    class Sized(Linear):
        def __init__(self, width: int = 3):
            super().__init__()
            self.save_hyperparameters()

    module = Sized()
    if skip:
        compat.skip_hyperparameter_logging(module)
    pl.Trainer(accelerator="cpu", max_steps=1, logger=CSVLogger(tmp_path), enable_checkpointing=False,
               enable_progress_bar=False, enable_model_summary=False).fit(module, loader())
    logged = "".join(p.read_text() for p in tmp_path.rglob("hparams.yaml"))  # no file: nothing logged
    assert ("width" in logged) is not skip
