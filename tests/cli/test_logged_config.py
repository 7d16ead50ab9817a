"""The config a run logs is the one it ran with: the values the data filled in, no ``???``;
and wandb is started without the settings it has retired."""
import pytest
import wandb
from cli_helpers import compose_config
from lightning.pytorch.loggers import WandbLogger

from lightning_rnn.tasks import train
from lightning_rnn.tasks.builders import build_datamodule, build_model, build_trainer


class FakeRun:
    """What wandb.init returns, recording the config logged to it."""

    id = name = "fake"

    def __init__(self):
        self.config = self
        self.logged = {}

    def update(self, values, allow_val_change=False):
        self.logged.update(values)

    def log(self, metrics, **kwargs):
        pass


@pytest.fixture
def wandb_init(monkeypatch):
    """wandb.init replaced: the keyword arguments of each call, and the run it returned."""
    calls = []

    def init(**kwargs):
        calls.append((kwargs, FakeRun()))
        return calls[-1][1]

    monkeypatch.setattr(wandb, "init", init)
    monkeypatch.setattr(wandb, "run", None)
    return calls


def contains_missing(value) -> bool:
    if isinstance(value, dict):
        return any(contains_missing(v) for v in value.values())
    if isinstance(value, list):
        return any(contains_missing(v) for v in value)
    return value == "???"


@pytest.mark.parametrize("overrides, from_data", [
    (["data.batch_size=4", "data.seq_len=16"], {"vocab"}),
    (["experiment=classification", "data.num_samples=40", "data.batch_size=8"], {"input_size", "num_classes"}),
])
def test_the_logged_config_holds_the_values_the_data_filled_in(tmp_path, wandb_init, overrides, from_data):
    cfg = compose_config(tmp_path, [*overrides, "logger=wandb", "callbacks=none", "model.rnn.backend=reference",
                                    "trainer.max_steps=1", "trainer.limit_val_batches=0", "optimized_metric=null"])
    train.run(cfg)
    ((kwargs, run),) = wandb_init
    logged = run.logged
    assert not contains_missing(logged)
    given = build_datamodule(cfg).model_kwargs()
    assert set(given) == from_data
    for name in from_data:
        assert logged["model"][name] == given[name]
    assert logged["model"]["_target_"] == cfg.model._target_
    assert logged["model"]["rnn"]["hidden_size"] == cfg.model.rnn.hidden_size
    assert logged["trainer"]["max_steps"] == cfg.trainer.max_steps


def test_wandb_is_not_passed_the_anonymous_setting_it_retired(tmp_path, wandb_init):
    """wandb warns 'The anonymous setting has no effect' whenever it is passed, even as None,
    which Lightning's WandbLogger does on every run."""
    cfg = compose_config(tmp_path, ["logger=wandb", "callbacks=none", "model.rnn.backend=reference"])
    datamodule = build_datamodule(cfg)
    build_trainer(cfg, built=build_model(cfg, datamodule))
    ((kwargs, _),) = wandb_init
    assert "anonymous" not in kwargs
    assert kwargs["project"] == "lightning_rnn" and kwargs["dir"] == str(tmp_path)


def test_an_anonymous_setting_a_user_gives_is_passed_on(wandb_init):
    from lightning_rnn.tasks.builders import drop_retired_wandb_settings

    logger = WandbLogger(anonymous=True, mode="offline")
    drop_retired_wandb_settings(logger)
    logger.experiment  # noqa: B018 (starts the run)
    ((kwargs, _),) = wandb_init
    assert kwargs["anonymous"] == "allow"
