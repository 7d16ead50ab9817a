"""The train task: fit the model, optionally test it, return the optimized metric."""
from __future__ import annotations

import logging

from lightning.pytorch import seed_everything
from omegaconf import DictConfig

from .builders import build_datamodule, build_model, build_trainer, check_layer_backends, data_model_kwargs
from .checkpoint_checks import (
    check_checkpoint_class, check_checkpoint_data, check_checkpoint_file, check_checkpoint_fits, check_resumable,
    checkpoint_class_name, resume_path,
)

log = logging.getLogger(__name__)


def run(cfg: DictConfig) -> float | None:
    """Train ``cfg.model`` on ``cfg.data``; resume from ``cfg.ckpt_path`` if given, else (``resume:
    auto``) from the last checkpoint the run's directory already holds (a job run again there).

    Returns:
        the final value of ``cfg.optimized_metric`` (None if it was never logged).
    """
    ckpt_path = resume_path(cfg)
    checkpoint = check_checkpoint_file(ckpt_path, required=False)
    if checkpoint is not None:  # resuming: the same kind of model, trained on the same data
        check_resumable(checkpoint, ckpt_path)
        check_checkpoint_class(checkpoint, ckpt_path, cfg.model._target_)
    seed_everything(cfg.seed, workers=True)
    datamodule = build_datamodule(cfg)
    if checkpoint is not None:
        check_checkpoint_data(ckpt_path, checkpoint.get("hyper_parameters") or {},
                              checkpoint_class_name(checkpoint) or "model", data_model_kwargs(datamodule))
    model = build_model(cfg, datamodule)
    if checkpoint is not None:
        check_checkpoint_fits(checkpoint, ckpt_path, model)
    trainer = build_trainer(cfg, built=model)
    check_layer_backends(model, trainer)
    if cfg.test_after_training:  # a test split too small for a batch: say so now, not after training
        datamodule.trainer = trainer  # the batch it needs: one per process (DDP), as in the test run
        datamodule.test_dataloader()
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    if trainer.is_global_zero:  # once, not once per process
        if trainer.checkpoint_callback is not None and trainer.checkpoint_callback.best_model_path:
            log.info("best checkpoint: %s", trainer.checkpoint_callback.best_model_path)
        log.info("final metrics: %s", {k: round(float(v), 4) for k, v in sorted(trainer.callback_metrics.items())})
    metric = trainer.callback_metrics.get(cfg.optimized_metric) if cfg.optimized_metric else None
    if cfg.optimized_metric and metric is None:
        missing_metric(cfg.optimized_metric, trainer)
    if cfg.test_after_training:
        trainer.test(model, datamodule=datamodule, ckpt_path="best" if trainer.checkpoint_callback else None)
    return None if metric is None else float(metric)


def missing_metric(name: str, trainer) -> None:
    """``optimized_metric`` was never logged: a warning in a single run; in a sweep (whose
    sweeper needs the value of every trial) an error that ends the sweep with the reason."""
    logged = ", ".join(sorted(trainer.callback_metrics)) or "nothing"
    message = (
        f"optimized_metric: {name!r} was never logged (logged: {logged}). Validation metrics need a "
        f"validation run: this one took {trainer.global_step} steps with "
        f"trainer.val_check_interval={trainer.val_check_interval} and "
        f"trainer.limit_val_batches={trainer.limit_val_batches}"
    )
    if in_sweep():
        raise ValueError(message)
    log.warning(message)


def in_sweep() -> bool:
    """Whether this run is one job of a Hydra multirun (e.g. an Optuna sweep)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
