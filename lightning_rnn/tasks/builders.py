"""Objects every task builds from the config: data, model, trainer."""
from __future__ import annotations

from pathlib import Path

from hydra.utils import get_class, instantiate
from lightning.pytorch import LightningModule, Trainer
from omegaconf import DictConfig, OmegaConf

from ..data import RNNDataModule


def build_datamodule(cfg: DictConfig) -> RNNDataModule:
    """``cfg.data`` instantiated, prepared and set up (so its ``model_kwargs`` are known)."""
    datamodule = instantiate(cfg.data)
    datamodule.prepare_data()
    datamodule.setup("fit")
    return datamodule


def build_model(cfg: DictConfig, datamodule: RNNDataModule) -> LightningModule:
    """``cfg.model`` instantiated with the sizes (vocab, input_size, ...) the data gives."""
    return instantiate(cfg.model, **datamodule.model_kwargs())


def load_model(cfg: DictConfig) -> LightningModule:
    """The ``cfg.model._target_`` class restored from ``cfg.ckpt_path`` (checkpoints hold
    the factories of the rnn and optimizer, so load only checkpoints you trust)."""
    if not cfg.ckpt_path or not Path(cfg.ckpt_path).is_file():
        raise ValueError(f"ckpt_path: this task needs a checkpoint file, pass ckpt_path=PATH/TO/FILE.ckpt "
                         f"(got {cfg.ckpt_path!r})")
    model_class = get_class(cfg.model._target_)
    return model_class.load_from_checkpoint(cfg.ckpt_path, map_location="cpu", weights_only=False)


def check_model_matches_data(model: LightningModule, datamodule: RNNDataModule) -> None:
    """A ValueError when the checkpoint was trained on other data (vocab, sizes)."""
    for name, value in datamodule.model_kwargs().items():
        if model.hparams.get(name) != value:
            raise ValueError(f"ckpt_path: the checkpoint's {name} differs from the data's; "
                             "pass the data settings it was trained with")


def build_trainer(cfg: DictConfig) -> Trainer:
    """``cfg.trainer`` with the callbacks of ``cfg.callbacks`` and loggers of ``cfg.logger``;
    the resolved config is logged as the run's hyperparameters."""
    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values()]
    loggers = [instantiate(c) for c in (cfg.get("logger") or {}).values()]
    trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    for logger in trainer.loggers:
        logger.log_hyperparams(resolved)
    return trainer
