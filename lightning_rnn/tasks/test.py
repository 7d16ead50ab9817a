"""The test task: evaluate a checkpoint on the data's test split."""
from __future__ import annotations

from omegaconf import DictConfig

from .builders import build_datamodule, build_trainer, check_layer_backends, check_model_matches_data, load_model


def run(cfg: DictConfig) -> dict[str, float]:
    """Metrics of ``cfg.ckpt_path`` on the test split of ``cfg.data``."""
    model = load_model(cfg)
    datamodule = build_datamodule(cfg)
    check_model_matches_data(model, datamodule, cfg.ckpt_path)
    trainer = build_trainer(cfg, loaded=model)
    check_layer_backends(model, trainer)
    (metrics,) = trainer.test(model, datamodule=datamodule)
    return metrics
