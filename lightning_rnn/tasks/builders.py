"""Objects every task builds from the config: data, model, trainer."""
from __future__ import annotations

from hydra.utils import get_class, instantiate
from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch import LightningDataModule, LightningModule, Trainer
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.loggers import WandbLogger
from omegaconf import DictConfig, OmegaConf

from ..kernels import dispatch
from ..layers import FusedRNNBase
from ..modules import factories
from ..utils.checkpoint_io import AtomicCheckpointIO
from ..utils.compat import skip_hyperparameter_logging
from .checkpoint_checks import check_checkpoint_data, check_checkpoint_file, one_line


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


def load_model(cfg: DictConfig) -> LightningModule:
    """The model saved in ``cfg.ckpt_path``: the class the checkpoint names (an RNNModule
    stores it), else ``cfg.model._target_``. Read with torch's ``weights_only`` loader:
    checkpoints hold the factories as plain data (:mod:`lightning_rnn.modules.factories`).
    Every setting comes from the checkpoint but the layer's kernel backend (:func:`backend_override`).
    A checkpoint that the class does not load is a ValueError naming the file."""
    path = cfg.ckpt_path
    checkpoint = check_checkpoint_file(path, required=True)
    saved_class = checkpoint.get("lightning_rnn_class")
    try:
        model_class = get_class(saved_class or cfg.model._target_)
    except (ImportError, AttributeError, ValueError) as err:
        raise ValueError(f"ckpt_path: {path} names the model class {saved_class}, which does not import here "
                         f"({one_line(err)})") from None
    try:
        model = model_class.load_from_checkpoint(path, map_location="cpu", **backend_override(cfg, checkpoint))
    except (RuntimeError, KeyError, TypeError) as err:  # state_dict keys or shapes, constructor arguments
        raise ValueError(f"ckpt_path: {path} does not load as a {model_class.__name__} ({one_line(err)}); pass "
                         "the model it was trained with (model=...)") from None
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


def check_model_matches_data(model: LightningModule, datamodule: LightningDataModule, path) -> None:
    """A ValueError naming the checkpoint file when ``model`` (read from it) was trained on
    other data (vocab, sizes) than ``datamodule`` gives, or takes none of it."""
    check_checkpoint_data(path, model.hparams, type(model).__name__, data_model_kwargs(datamodule))


def build_trainer(cfg: DictConfig, loaded: LightningModule | None = None,
                  built: LightningModule | None = None) -> Trainer:
    """``cfg.trainer`` with the callbacks of ``cfg.callbacks`` and loggers of ``cfg.logger``;
    the config as resolved for the run is logged as its hyperparameters: its ``model`` replaced
    by the settings of ``loaded`` (a model read from ``ckpt_path``, which ``cfg.model`` did not
    build), or completed with those of ``built`` (the model ``cfg.model`` built: the values the
    data filled in, such as the vocabulary and input size, and the defaults it took)."""
    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values()]
    loggers = [instantiate(c) for c in (cfg.get("logger") or {}).values()]
    if not loggers:  # logger=none: nothing for a LearningRateMonitor to log to (Lightning refuses it)
        callbacks = [c for c in callbacks if not isinstance(c, LearningRateMonitor)]
    for logger in loggers:
        drop_retired_wandb_settings(logger)
    trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False, plugins=trainer_plugins(cfg))
    resolved = OmegaConf.to_container(cfg, resolve=True)
    if loaded is not None:
        resolved["model"] = {"_target_": f"{type(loaded).__module__}.{type(loaded).__qualname__}",
                             **loaded.hparams_initial}
    elif built is not None:
        resolved["model"] = {**resolved.get("model", {}), **built.hparams_initial}
    for logger in trainer.loggers:
        logger.log_hyperparams(resolved)
    return trainer


def drop_retired_wandb_settings(logger) -> None:
    """Leave out of a WandbLogger's ``wandb.init`` arguments the ``anonymous`` setting that
    Lightning passes (as None) on every run and wandb has retired: wandb warns "The anonymous
    setting has no effect" whenever it is passed at all. A value the user set is kept. Lightning
    keeps the arguments in ``_wandb_init``, with no public way to change them."""
    init = getattr(logger, "_wandb_init", None) if isinstance(logger, WandbLogger) else None
    if isinstance(init, dict) and "anonymous" in init and init["anonymous"] is None:
        del init["anonymous"]


def trainer_plugins(cfg: DictConfig) -> list:
    """``cfg.trainer.plugins`` (configs instantiated; names such as precision strings kept),
    and an :class:`~lightning_rnn.utils.checkpoint_io.AtomicCheckpointIO` unless they hold a
    CheckpointIO of their own: a save that fails, or a run killed during one, leaves the
    previous checkpoint whole."""
    plugins = cfg.trainer.get("plugins") or []
    plugins = [plugins] if not OmegaConf.is_list(plugins) and not isinstance(plugins, list) else list(plugins)
    plugins = [instantiate(p) if OmegaConf.is_dict(p) else p for p in plugins]
    if not any(isinstance(p, CheckpointIO) for p in plugins):
        plugins.append(AtomicCheckpointIO())
    return plugins


def check_layer_backends(model: LightningModule, trainer: Trainer) -> None:
    """Every fused layer's kernel backend runs on the Trainer's device and loads (the cpp
    extension builds now): a ValueError or BackendUnavailable naming it before the run
    starts, not at the first batch, after the model summary. Resolving runs the compiled
    backend's self-check (kernels/selfcheck.py) now too, and ``auto`` resolves here as well,
    so that a first use's build is not counted in a run's ``max_time``."""
    device = trainer.strategy.root_device
    for name, module in model.named_modules():
        backend = module.backend if isinstance(module, FusedRNNBase) else None
        if backend == "auto":
            dispatch.resolve(backend, device)  # builds the device's kernels (or warns and falls back)
            continue
        if backend not in dispatch.KERNEL_BACKENDS or backend == "reference":
            continue
        if backend not in dispatch.PREFERENCE.get(device.type, ()):
            raise ValueError(f"model.{name}.backend: {backend!r} does not run on the Trainer's {device.type} device "
                             "(the cuda backend needs trainer=gpu, cpp a CPU; backend=auto picks the device's)")
        dispatch.resolve(backend, device)
