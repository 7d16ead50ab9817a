"""Checkpoints hold the factories as plain data: torch's weights_only loader reads them, so
Lightning's Trainer resumes and evaluates from them without being told weights_only=False."""
import functools
import inspect

import pytest
import torch
from modules_helpers import adam, batches_loader, rnn_factory, tiny_trainer
from omegaconf import OmegaConf

from lightning_rnn.layers import FusedGRU, FusedLSTM
from lightning_rnn.modules import SequenceRegressor, factories


def regression_batches(count=3):
    torch.manual_seed(0)
    return [{"inputs": torch.randn(4, 6, 3), "targets": torch.randn(4, 2, 1)} for _ in range(count)]


def regressor(**kwargs):
    return SequenceRegressor(input_size=3, output_size=1, horizon=2, rnn=rnn_factory(hidden_size=5),
                             optimizer=adam(), **kwargs)


@pytest.mark.parametrize("value", [
    functools.partial(FusedLSTM, hidden_size=8, num_layers=2, dtype=torch.float64),
    functools.partial(torch.optim.Adam, lr=1e-3, betas=(0.8, 0.9)),
    functools.partial(torch.optim.lr_scheduler.LambdaLR, lr_lambda=functools.partial(pow, 0.5)),
    functools.partial(FusedGRU, 4, 8),  # positional arguments
    functools.partial(torch.optim.SGD, lr=OmegaConf.create({"v": 0.1}).v, momentum=0.9),
    torch.optim.Adam,
], ids=["layer_with_dtype", "tuple_keyword", "nested_partial", "positional", "from_omegaconf", "class"])
def test_described_factories_rebuild_as_they_were(value, tmp_path):
    description = factories.describe(value)
    torch.save(description, tmp_path / "d.pt")
    rebuilt = factories.rebuild(torch.load(tmp_path / "d.pt", weights_only=True))
    if isinstance(value, functools.partial):
        assert isinstance(rebuilt, functools.partial)
        assert rebuilt.func is value.func and rebuilt.args == value.args
        assert rebuilt.keywords.keys() == value.keywords.keys()
        for key, item in value.keywords.items():
            got = rebuilt.keywords[key]
            if isinstance(item, functools.partial):
                assert (got.func, got.args, got.keywords) == (item.func, item.args, item.keywords)
            else:
                assert got == item and type(got) is type(item)
    else:
        assert rebuilt is value


def test_values_with_no_plain_description_are_named():
    with pytest.raises(factories.NotDescribable, match="no importable name"):
        factories.describe(functools.partial(torch.optim.Adam, lr=1e-3, foreach=lambda: None))
    with pytest.raises(factories.NotDescribable, match="Tensor"):
        factories.describe(functools.partial(torch.optim.Adam, lr=torch.tensor(1e-3)))


def test_trainer_resumes_from_a_checkpoint_without_weights_only_false(tmp_path):
    """Trainer.fit/validate(ckpt_path=...) load with torch's weights_only loader."""
    trainer = tiny_trainer(max_steps=2)
    trainer.fit(regressor(), batches_loader(regression_batches()))
    trainer.save_checkpoint(tmp_path / "step2.ckpt")
    saved = torch.load(tmp_path / "step2.ckpt", weights_only=True)
    assert saved["lightning_rnn_factories"] == ["rnn", "optimizer"]
    resumed = tiny_trainer(max_steps=5)
    model = regressor()
    resumed.fit(model, batches_loader(regression_batches()), ckpt_path=tmp_path / "step2.ckpt")
    assert resumed.global_step == 5
    (metrics,) = tiny_trainer().validate(regressor(), batches_loader(regression_batches(1)),
                                         ckpt_path=tmp_path / "step2.ckpt", verbose=False)
    assert "val/loss" in metrics


def test_a_factory_with_no_description_is_pickled_and_loads_trusted(tmp_path):
    """A tensor argument has no plain description: the checkpoint keeps the factory as an
    object (pickled), and loading it takes weights_only=False, which torch's refusal names."""
    model = SequenceRegressor(input_size=3, output_size=1, horizon=2, rnn=rnn_factory(hidden_size=5),
                              optimizer=functools.partial(torch.optim.SGD, lr=torch.tensor(0.1)))
    trainer = tiny_trainer(max_steps=1)
    trainer.fit(model, batches_loader(regression_batches(1)))
    trainer.save_checkpoint(tmp_path / "model.ckpt")
    assert torch.load(tmp_path / "model.ckpt", weights_only=False)["lightning_rnn_factories"] == ["rnn"]
    with pytest.raises(Exception, match="weights_only"):
        SequenceRegressor.load_from_checkpoint(tmp_path / "model.ckpt")
    restored = SequenceRegressor.load_from_checkpoint(tmp_path / "model.ckpt", weights_only=False)
    assert restored.hparams.optimizer.keywords["lr"] == torch.tensor(0.1)
    torch.testing.assert_close(restored.output_layer.weight, model.output_layer.weight)


def test_load_from_checkpoint_on_a_lightning_whose_loader_has_no_weights_only(tmp_path, monkeypatch):
    """Lightning < 2.6: LightningModule.load_from_checkpoint has no weights_only (a keyword it
    does not know reaches __init__) and reads with weights_only=False; the module's own read
    applies weights_only, so a pickled checkpoint is still refused unless it is False."""
    from lightning.pytorch import LightningModule
    from lightning.pytorch.core.saving import _load_from_checkpoint

    unpickling = {"weights_only": False} if "weights_only" in inspect.signature(_load_from_checkpoint).parameters \
        else {}  # Lightning 2.6's helper takes it; 2.5's reads with weights_only=False itself

    def load_from_checkpoint(cls, checkpoint_path, map_location=None, hparams_file=None, strict=None, **kwargs):
        return _load_from_checkpoint(cls, checkpoint_path, map_location, hparams_file, strict, **unpickling, **kwargs)

    monkeypatch.setattr(LightningModule, "load_from_checkpoint", classmethod(load_from_checkpoint))
    lr = {"described": 0.1, "pickled": torch.tensor(0.1)}  # a tensor has no plain description
    for name, value in lr.items():
        model = SequenceRegressor(input_size=3, output_size=1, horizon=2, rnn=rnn_factory(hidden_size=5),
                                  optimizer=functools.partial(torch.optim.SGD, lr=value))
        trainer = tiny_trainer(max_steps=1)
        trainer.fit(model, batches_loader(regression_batches(1)))
        trainer.save_checkpoint(tmp_path / f"{name}.ckpt")
    for weights_only in (None, True, False):
        restored = SequenceRegressor.load_from_checkpoint(tmp_path / "described.ckpt", weights_only=weights_only)
        assert restored.hparams.optimizer.keywords["lr"] == 0.1
    for weights_only in (None, True):
        with pytest.raises(Exception, match="weights_only"):
            SequenceRegressor.load_from_checkpoint(tmp_path / "pickled.ckpt", weights_only=weights_only)
    restored = SequenceRegressor.load_from_checkpoint(tmp_path / "pickled.ckpt", weights_only=False)
    assert restored.hparams.optimizer.keywords["lr"] == torch.tensor(0.1)


def test_a_factory_that_cannot_be_pickled_still_trains():
    """Lightning drops a lambda from hparams (it cannot be pickled); the module keeps using it."""
    built = []

    def schedule(optimizer):
        built.append(torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5))
        return built[-1]

    model = regressor(scheduler=lambda optimizer: schedule(optimizer))
    tiny_trainer(max_steps=2).fit(model, batches_loader(regression_batches()))
    assert len(built) == 1 and built[0].last_epoch == 2


def test_load_from_checkpoint_keyword_arguments_override_the_saved_factories(tmp_path):
    trainer = tiny_trainer(max_steps=1)
    trainer.fit(regressor(), batches_loader(regression_batches(1)))
    trainer.save_checkpoint(tmp_path / "model.ckpt")
    restored = SequenceRegressor.load_from_checkpoint(tmp_path / "model.ckpt", optimizer=adam(lr=0.5))
    assert restored.hparams.optimizer.keywords["lr"] == 0.5
    assert isinstance(restored.rnn, FusedLSTM) and restored.rnn.hidden_size == 5


def test_hyperparameters_reach_the_logger_with_the_factories_described(tmp_path):
    """A CSV logger's hparams.yaml gets every argument, the factories as descriptions
    (Lightning skipped them, or logged None, for the objects)."""
    import yaml
    from lightning.pytorch.loggers import CSVLogger

    model = regressor()
    trainer = tiny_trainer(max_steps=1, logger=CSVLogger(tmp_path))
    trainer.fit(model, batches_loader(regression_batches(1)))
    logged = yaml.safe_load((tmp_path / "lightning_logs" / "version_0" / "hparams.yaml").read_text())
    assert logged["rnn"] == {"_target_": "lightning_rnn.FusedLSTM", "_partial_": True, "hidden_size": 5,
                             "num_layers": 1, "backend": "reference"}
    assert logged["optimizer"]["lr"] == 1e-2 and logged["horizon"] == 2
    assert isinstance(model.hparams.rnn, functools.partial)  # hparams keeps the factory itself


def test_a_checkpoint_with_the_former_optimization_arguments_loads_without_them(tmp_path):
    """Earlier versions took grad_clip, grad_clip_algorithm and accumulate_grad_batches, which
    are the Trainer's settings now: a checkpoint holding them loads, with a warning."""
    model = regressor()
    trainer = tiny_trainer(max_steps=1)
    trainer.fit(model, batches_loader(regression_batches(1)))
    trainer.save_checkpoint(tmp_path / "model.ckpt")
    saved = torch.load(tmp_path / "model.ckpt", weights_only=True)
    saved["hyper_parameters"].update(grad_clip=1.0, grad_clip_algorithm="norm", accumulate_grad_batches=1)
    torch.save(saved, tmp_path / "model.ckpt")
    with pytest.warns(UserWarning, match=r"grad_clip=1.0, grad_clip_algorithm='norm', accumulate_grad_batches=1 "
                                         r"are Trainer settings now .* Trainer\(gradient_clip_val=\.\.\."):
        restored = SequenceRegressor.load_from_checkpoint(tmp_path / "model.ckpt")
    torch.testing.assert_close(restored.output_layer.weight, model.output_layer.weight)
    assert "grad_clip" not in restored.hparams


@pytest.mark.parametrize("old", ["lightning_rnn.layers.cells.FusedLSTM", "lightning_rnn.layers.recurrent.FusedLSTM"])
def test_factories_named_at_a_moved_module_still_rebuild(old):
    """Checkpoints of earlier versions name the layer where its module then was; rebuild
    reads it at its new place (new checkpoints name the package's own export)."""
    description = factories.describe(functools.partial(FusedLSTM, hidden_size=5))
    assert description["_target_"] == "lightning_rnn.FusedLSTM"
    rebuilt = factories.rebuild({**description, "_target_": old})
    assert rebuilt.func is FusedLSTM and rebuilt.keywords == {"hidden_size": 5}
