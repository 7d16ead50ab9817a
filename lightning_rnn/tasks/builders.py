"""Objects every task builds from the config: data, model, trainer."""
from __future__ import annotations

import pickle
from pathlib import Path

import torch
from hydra.utils import get_class, instantiate
from lightning.pytorch import LightningDataModule, LightningModule, Trainer
from lightning.pytorch.callbacks import LearningRateMonitor
from omegaconf import DictConfig, OmegaConf

from ..kernels import dispatch
from ..layers import FusedRNNBase
from ..modules import factories
from ..utils.compat import skip_hyperparameter_logging


def data_model_kwargs(datamodule: LightningDataModule) -> dict:
    """The constructor arguments the model takes from the data: ``datamodule.model_kwargs()``
    (as :class:`~lightning_rnn.data.RNNDataModule` gives them), none for a data module
    without that method (any LightningDataModule: the config gives the model's sizes)."""
    model_kwargs = getattr(datamodule, "model_kwargs", None)
    return model_kwargs() if callable(model_kwargs) else {}


def build_datamodule(cfg: DictConfig) -> LightningDataModule:
    """``cfg.data`` instantiated, prepared and set up (so its ``model_kwargs`` are known)."""
    datamodule = instantiate(cfg.data)
    datamodule.prepare_data()
    datamodule.setup("fit")
    return datamodule


def build_model(cfg: DictConfig, datamodule: LightningDataModule) -> LightningModule:
    """``cfg.model`` instantiated with the sizes (vocab, input_size, ...) the data gives.
    The run logs the whole resolved config (build_trainer), so the model does not log its
    own hyperparameters too."""
    given = data_model_kwargs(datamodule)
    needed = [k for k in cfg.model if OmegaConf.is_missing(cfg.model, k) and k not in given]
    if needed:
        model = str(cfg.model.get("_target_", "the model")).rsplit(".", 1)[-1]
        raise ValueError(
            f"model: {model} needs {', '.join(needed)} from the data, which {type(datamodule).__name__} does not "
            f"give (it gives {', '.join(given) or 'nothing'}); pick a model and data that go together: "
            "model=char_lm with data=char_python/char_shakespeare/char_file/copy_memory, model=classifier with "
            "data=classification, model=regressor with data=forecasting/adding_problem (an experiment=... "
            "recipe picks both); with data of your own, set them in the config (model.NAME=...) or give its "
            "data module a model_kwargs() method that returns them"
        )
    model = instantiate(cfg.model, **given)
    skip_hyperparameter_logging(model)
    return model


def check_checkpoint_file(cfg: DictConfig, required: bool) -> dict | None:
    """The checkpoint at ``cfg.ckpt_path`` (memory-mapped: tensors are not read), or None
    when unset and not ``required``. A ValueError naming ``ckpt_path`` when it is not an
    existing file, or not one torch's ``weights_only`` loader reads."""
    if not required and not cfg.ckpt_path:
        return None
    if not cfg.ckpt_path or not Path(cfg.ckpt_path).is_file():
        need = "this task needs" if required else "expected"
        raise ValueError(f"ckpt_path: {need} a checkpoint file, pass ckpt_path=PATH/TO/FILE.ckpt "
                         f"(got {cfg.ckpt_path!r})")
    try:
        # weights_only said: torch < 2.6 defaults to False, which unpickles anything
        checkpoint = torch.load(cfg.ckpt_path, map_location="cpu", mmap=True, weights_only=True)
    except pickle.UnpicklingError as err:
        raise ValueError(
            f"ckpt_path: {cfg.ckpt_path} holds pickled Python objects, which torch's weights_only loader "
            "refuses (a checkpoint of an earlier lightning_rnn, or a factory with no plain description). "
            "If you trust it, load it in Python: Model.load_from_checkpoint(path, weights_only=False)"
        ) from err
    except (RuntimeError, OSError, EOFError, ValueError) as err:
        raise ValueError(f"ckpt_path: {cfg.ckpt_path} is not a readable torch checkpoint ({err})") from None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise ValueError(f"ckpt_path: {cfg.ckpt_path} is not a Lightning checkpoint (no 'state_dict'); "
                         "save one with Trainer.save_checkpoint or a ModelCheckpoint callback")
    return checkpoint


def check_checkpoint_fits(checkpoint: dict, model: LightningModule) -> None:
    """A ValueError naming ``ckpt_path`` when the checkpoint's weights have other shapes than
    ``model``'s (it was trained with other model or data settings), before Lightning's
    size-mismatch traceback."""
    saved, current = checkpoint["state_dict"], model.state_dict()
    differ = [f"{k} (checkpoint {tuple(v.shape)}, now {tuple(current[k].shape)})"
              for k, v in saved.items() if k in current and tuple(v.shape) != tuple(current[k].shape)]
    missing = sorted(set(current) - set(saved))
    if differ or missing:
        found = "; ".join(differ[:3] + [f"missing {', '.join(missing[:3])}"] * bool(missing))
        raise ValueError(f"ckpt_path: the checkpoint does not fit this model: {found}; pass the model and data "
                         "settings it was trained with")


def load_model(cfg: DictConfig) -> LightningModule:
    """The model saved in ``cfg.ckpt_path``: the class the checkpoint names (an RNNModule
    stores it), else ``cfg.model._target_``. Read with torch's ``weights_only`` loader:
    checkpoints hold the factories as plain data (:mod:`lightning_rnn.modules.factories`).
    Every setting comes from the checkpoint but the layer's kernel backend (:func:`backend_override`)."""
    checkpoint = check_checkpoint_file(cfg, required=True)
    model_class = get_class(checkpoint.get("lightning_rnn_class") or cfg.model._target_)
    model = model_class.load_from_checkpoint(cfg.ckpt_path, map_location="cpu", **backend_override(cfg, checkpoint))
    skip_hyperparameter_logging(model)  # the run logs its config (build_trainer)
    return model


def backend_override(cfg: DictConfig, checkpoint: dict) -> dict:
    """``{"rnn": factory}``: the checkpoint's rnn factory with ``cfg.model.rnn.backend``, which
    says how to run the weights, not what they learned (a checkpoint trained with
    ``backend=cuda`` samples on a CPU with the default ``auto``, and ``model.rnn.backend=...``
    is not ignored); ``{}`` when the checkpoint holds no such factory description."""
    rnn = (checkpoint.get("hyper_parameters") or {}).get("rnn")
    backend = OmegaConf.select(cfg, "model.rnn.backend")
    if backend is None or not isinstance(rnn, dict) or "backend" not in rnn:
        return {}
    return {"rnn": factories.rebuild({**rnn, "backend": backend})}


def check_model_matches_data(model: LightningModule, datamodule: LightningDataModule) -> None:
    """A ValueError when the checkpoint was trained on other data (vocab, sizes)."""
    for name, value in data_model_kwargs(datamodule).items():
        if model.hparams.get(name) != value:
            raise ValueError(f"ckpt_path: the checkpoint's {name} differs from the data's; "
                             "pass the data settings it was trained with")


def build_trainer(cfg: DictConfig, loaded: LightningModule | None = None) -> Trainer:
    """``cfg.trainer`` with the callbacks of ``cfg.callbacks`` and loggers of ``cfg.logger``;
    the resolved config is logged as the run's hyperparameters, its ``model`` replaced by the
    settings of ``loaded`` (a model read from ``ckpt_path``, which ``cfg.model`` did not build)."""
    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values()]
    loggers = [instantiate(c) for c in (cfg.get("logger") or {}).values()]
    if not loggers:  # logger=none: nothing for a LearningRateMonitor to log to (Lightning refuses it)
        callbacks = [c for c in callbacks if not isinstance(c, LearningRateMonitor)]
    trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    if loaded is not None:
        resolved["model"] = {"_target_": f"{type(loaded).__module__}.{type(loaded).__qualname__}",
                             **loaded.hparams_initial}
    for logger in trainer.loggers:
        logger.log_hyperparams(resolved)
    return trainer


def check_layer_backends(model: LightningModule, trainer: Trainer) -> None:
    """Every fused layer's kernel backend runs on the Trainer's device and loads (the cpp
    extension builds now): a ValueError or BackendUnavailable naming it before the run
    starts, not at the first batch, after the model summary."""
    device = trainer.strategy.root_device
    for name, module in model.named_modules():
        backend = module.backend if isinstance(module, FusedRNNBase) else None
        if backend not in dispatch.KERNEL_BACKENDS or backend == "reference":
            continue
        if backend not in dispatch.PREFERENCE.get(device.type, ()):
            raise ValueError(f"model.{name}.backend: {backend!r} does not run on the Trainer's {device.type} device "
                             "(the cuda backend needs trainer=gpu, cpp a CPU; backend=auto picks the device's)")
        dispatch.load(backend)
