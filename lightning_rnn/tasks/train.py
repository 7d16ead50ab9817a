"""The train task: fit the model, optionally test it, return the optimized metric."""
from __future__ import annotations

import logging

from lightning.pytorch import seed_everything
from omegaconf import DictConfig

from .builders import build_datamodule, build_model, build_trainer, check_checkpoint_file

log = logging.getLogger(__name__)


def run(cfg: DictConfig) -> float | None:
    """Train ``cfg.model`` on ``cfg.data``; resume from ``cfg.ckpt_path`` if given.

    Returns:
        the final value of ``cfg.optimized_metric`` (None if it was never logged).
    """
    check_checkpoint_file(cfg, required=False)
    seed_everything(cfg.seed, workers=True)
    datamodule = build_datamodule(cfg)
    model = build_model(cfg, datamodule)
    trainer = build_trainer(cfg)
    # weights_only=False: the checkpoints hold the rnn/optimizer factories (RNNModule.load_from_checkpoint)
    trainer.fit(model, datamodule=datamodule, ckpt_path=cfg.ckpt_path, weights_only=False)
    if trainer.checkpoint_callback is not None and trainer.checkpoint_callback.best_model_path:
        log.info("best checkpoint: %s", trainer.checkpoint_callback.best_model_path)
    log.info("final metrics: %s", {k: round(float(v), 4) for k, v in sorted(trainer.callback_metrics.items())})
    metric = trainer.callback_metrics.get(cfg.optimized_metric)
    if cfg.test_after_training:
        trainer.test(model, datamodule=datamodule, ckpt_path="best" if trainer.checkpoint_callback else None,
                     weights_only=False)
    return None if metric is None else float(metric)
