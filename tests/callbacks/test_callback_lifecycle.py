"""The callbacks around the edges of a run: a fit that raises, layers built in
configure_model, datamodules from LightningDataModule.from_datasets, odd datasets."""
import functools

import pytest
import torch
from callback_helpers import INPUT, TinyClassifier, VariableLengthDataset, loader, make_trainer, pad_collate
from lightning.pytorch import LightningDataModule, Trainer
from lightning.pytorch.plugins.precision import Precision
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from lightning_rnn import FusedLSTM
from lightning_rnn.callbacks import GPUMemoryLogger, GradientCheckpointing, MixedPrecision, PackedSequences
from lightning_rnn.callbacks.mixed_precision import RNNMixedPrecision
from lightning_rnn.callbacks.packed_sequences import dataset_lengths
from lightning_rnn.modules import SequenceClassifier


class FailsAtSecondBatch(TinyClassifier):
    def training_step(self, batch, batch_idx):
        if batch_idx == 1:
            raise RuntimeError("out of memory (simulated)")
        return super().training_step(batch, batch_idx)


class Data(LightningDataModule):
    def train_dataloader(self):
        return loader(32)


@pytest.mark.filterwarnings("ignore:MixedPrecision.*on a CPU without native bf16:UserWarning")
def test_a_fit_that_raises_leaves_model_trainer_and_data_as_they_were():
    """Lightning calls on_exception, not teardown, when a run raises: each callback undoes
    its changes there too, so the next run starts clean."""
    model, data = FailsAtSecondBatch(), Data()
    memory = GPUMemoryLogger(every_n_steps=1)
    trainer, _ = make_trainer([PackedSequences(), MixedPrecision(), memory, GradientCheckpointing(chunk_size=5)])
    plugin = trainer.strategy.precision_plugin
    with pytest.raises(RuntimeError, match="simulated"):  # (the warning depends on the CPU)
        trainer.fit(model, datamodule=data)
    assert model.rnn.checkpoint_chunk_size is None
    assert trainer.strategy.precision_plugin is plugin and type(plugin) is Precision
    assert "train_dataloader" not in vars(data)
    assert not model.rnn._forward_pre_hooks and not model.rnn._forward_hooks
    again, _ = make_trainer([PackedSequences(), memory], max_steps=2)
    again.fit(TinyClassifier(), datamodule=data)
    assert again.global_step == 2


def test_packed_sequences_gives_back_a_from_datasets_loader():
    """from_datasets sets train_dataloader on the instance: restored, not deleted."""
    data = LightningDataModule.from_datasets(train_dataset=VariableLengthDataset(32), batch_size=8)
    data.train_dataloader = functools.partial(DataLoader, VariableLengthDataset(32), batch_size=8,
                                              collate_fn=pad_collate)
    own = data.train_dataloader
    trainer, _ = make_trainer([PackedSequences(bucket_size=16)], max_steps=2)
    trainer.fit(TinyClassifier(), datamodule=data)
    assert data.train_dataloader is own
    plain, _ = make_trainer(max_steps=2)
    plain.fit(TinyClassifier(), datamodule=data)
    assert plain.global_step == 2


class BuiltInConfigureModel(TinyClassifier):
    def __init__(self):
        super().__init__()
        del self.rnn

    def configure_model(self):
        if not hasattr(self, "rnn"):
            self.rnn = FusedLSTM(INPUT, 16, 2, batch_first=True)


def test_layers_built_in_configure_model_are_found():
    model, memory = BuiltInConfigureModel(), GPUMemoryLogger(every_n_steps=1)
    trainer, logger = make_trainer([GradientCheckpointing(chunk_size=4), memory], max_steps=2)
    trainer.fit(model, loader(32))
    assert [seen["chunk_size"] for seen in model.seen] == [4, 4]
    assert all(v > 0 for v in logger.values("memory/activation_mb"))


def test_packed_inputs_go_through_the_modules_input_layer():
    """A classifier embedding token ids, with PackedSequences packing its inputs first."""

    class TokenClassifier(SequenceClassifier):
        def __init__(self):
            super().__init__(input_size=4, num_classes=2, rnn=functools.partial(FusedLSTM, hidden_size=8),
                             optimizer=functools.partial(torch.optim.SGD, lr=0.1))
            self.input_layer = nn.Embedding(10, 4)

    items = [{"inputs": torch.randint(0, 10, (n,)), "targets": torch.tensor(n % 2)} for n in (3, 7, 5, 2, 6, 4)]
    token_loader = DataLoader(items, batch_size=3, collate_fn=pad_collate)
    trainer, logger = make_trainer([PackedSequences(bucket_size=6)], max_steps=2)
    trainer.fit(TokenClassifier(), token_loader)
    assert trainer.global_step == 2 and len(logger.values("packed/padding_efficiency")) == 2


def test_dataset_lengths_read_padded_items_and_name_what_is_missing():
    padded = [{"inputs": torch.zeros(9, 2), "lengths": n} for n in (3, 9, 5)]
    assert dataset_lengths(padded, "inputs").tolist() == [3, 9, 5]
    with pytest.raises(TypeError, match="cannot read the sequence lengths of list's items .* `lengths` attribute"):
        dataset_lengths([(torch.zeros(3, 2), 0)], "inputs")
    with pytest.raises(TypeError, match="cannot read the sequence lengths of list's items"):
        dataset_lengths([torch.zeros(3, 2), torch.zeros(5, 2)], "inputs")  # was torch's `in` RuntimeError

    class Stream(IterableDataset):
        def __iter__(self):
            yield {"inputs": torch.zeros(3, 2)}

    with pytest.raises(TypeError, match="bucketing needs a map-style dataset .* bucketing=False"):
        dataset_lengths(Stream(), "inputs")


def test_tokens_per_second_counts_the_training_step_only(monkeypatch):
    """Validation between two steps is not counted (it made one value 100x lower). On a
    clock of the test's own, a training step lasts 1 s and validation 1000 s."""
    from types import SimpleNamespace

    from lightning_rnn.callbacks import packed_sequences

    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(packed_sequences, "time", SimpleNamespace(perf_counter=lambda: clock.now))

    class SlowValidation(TinyClassifier):
        def training_step(self, batch, batch_idx):
            clock.now += 1.0
            return super().training_step(batch, batch_idx)

        def validation_step(self, batch, batch_idx):
            clock.now += 1000.0

    trainer, logger = make_trainer([PackedSequences()], max_steps=4, limit_val_batches=1, val_check_interval=2)
    module = SlowValidation()
    trainer.fit(module, loader(32), loader(8))
    rates = logger.values("packed/tokens_per_sec")  # validation ran between steps 2 and 3
    seconds = [int(seen["lengths"].sum()) / rate for seen, rate in zip(module.seen, rates, strict=True)]
    assert len(seconds) == 4 and seconds == pytest.approx([1.0] * 4), seconds


def test_skipped_steps_stay_cumulative_across_a_checkpoint():
    plugin = RNNMixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu", init_scale=8.0))
    plugin.skipped_steps = 3
    restored = RNNMixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu"))
    restored.load_state_dict(plugin.state_dict())
    assert restored.skipped_steps == 3 and restored.loss_scale == 8.0


def test_fp16_on_cpu_warns_and_a_converted_16_mixed_is_explained():
    trainer, _ = make_trainer([MixedPrecision("fp16")], max_steps=1)
    with pytest.warns(UserWarning, match="dtype='fp16'.* on CPU"):
        trainer.fit(TinyClassifier(), loader(16))
    trainer, _ = make_trainer([MixedPrecision("fp16")], max_steps=1, precision="16-mixed")
    with pytest.raises(ValueError, match="Lightning runs precision='16-mixed' as 'bf16-mixed' on CPU") as caught:
        trainer.fit(TinyClassifier(), loader(16))
    assert "precision='16-mixed'," not in str(caught.value).split(";")[1]  # the advice does not repeat the loop
    assert "use Trainer(precision='32-true'), or drop one of the two" in str(caught.value)


@pytest.mark.parametrize("precision", ["16-true", "bf16-true", "64-true"])
def test_fp16_on_cpu_is_not_advised_to_use_16_mixed(precision):
    """On CPU Lightning runs '16-mixed' as 'bf16-mixed', which MixedPrecision('fp16') refuses too."""
    trainer, _ = make_trainer([MixedPrecision("fp16")], max_steps=1, precision=precision)
    with pytest.raises(ValueError, match=rf"disagrees with Trainer\(precision='{precision}'\)") as caught:
        trainer.fit(TinyClassifier(), loader(16))
    assert "16-mixed" not in str(caught.value)
    assert "use Trainer(precision='32-true'), or drop one of the two" in str(caught.value)


def test_memory_logger_says_when_it_has_nothing_to_log():
    class NoFusedLayers(TinyClassifier):
        def __init__(self):
            super().__init__()
            self.rnn = nn.LSTM(INPUT, 16, 2, batch_first=True)

        def features(self, inputs, lengths):
            return self.rnn(inputs)[1][0][-1]

    trainer, _ = make_trainer([GPUMemoryLogger()], max_steps=1)
    with pytest.warns(UserWarning, match="no FusedLSTM/FusedGRU layers; memory/activation_mb stays 0"):
        trainer.fit(NoFusedLayers(), loader(16))
    quiet = Trainer(accelerator="cpu", max_steps=1, callbacks=[GPUMemoryLogger()], logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    with pytest.warns(UserWarning, match="GPUMemoryLogger: the Trainer has no logger; nothing will be logged"):
        quiet.fit(TinyClassifier(), loader(16))


@pytest.mark.parametrize("build, error, message", [
    (lambda: GradientCheckpointing(modules=["head", "head"]), ValueError, "modules: expected distinct"),
    (lambda: GPUMemoryLogger(snapshot_max_entries=-5), ValueError, "snapshot_max_entries: expected an int >= 1"),
    (lambda: PackedSequences(pack_keys=[1]), TypeError, "pack_keys: expected a list of batch keys"),
    (lambda: PackedSequences(pack_keys=3), TypeError, "pack_keys: expected a list of batch keys, got 3"),
    (lambda: PackedSequences(inputs_key=0), TypeError, "inputs_key: expected a batch key .a str., got 0"),
    # strings were read as True: shuffle="false" shuffled
    (lambda: PackedSequences(shuffle="false"), TypeError, "shuffle: expected a bool, got 'false'"),
    (lambda: PackedSequences(bucketing="no"), TypeError, "bucketing: expected a bool, got 'no'"),
])
def test_bad_callback_arguments_are_named(build, error, message):
    with pytest.raises(error, match=message):
        build()


def test_pack_keys_may_be_one_name():
    assert PackedSequences(pack_keys="inputs").pack_keys == ("inputs",)
