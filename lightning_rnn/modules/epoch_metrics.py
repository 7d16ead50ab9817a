"""What a module logs: each training batch's loss, and per stage the epoch means of the loss
(weighted by each batch's targets) and of the torchmetrics."""
from __future__ import annotations

import torch
from lightning.pytorch import LightningModule
from torchmetrics import MeanMetric, Metric, MetricCollection

STAGES = ("train", "val", "test")


def add_stage_metrics(module: LightningModule, collection: MetricCollection | None) -> None:
    """``module.{stage}_mean_loss`` (a MeanMetric) and ``module.{stage}_metrics`` (a copy of
    ``collection`` prefixed ``{stage}/``, or None) for every stage."""
    for stage in STAGES:
        setattr(module, f"{stage}_mean_loss", MeanMetric())
        setattr(module, f"{stage}_metrics", collection.clone(prefix=f"{stage}/") if collection is not None else None)


def log_train_loss(module: LightningModule, weighted_loss: torch.Tensor, weight: int, sequences: int) -> torch.Tensor:
    """Log ``train/loss`` = ``weighted_loss / weight`` (the mean over a batch's chunks, each
    weighted by its ``loss_weight``) and the metrics derived from it; under DDP the global
    batch's, summed over every process's rows first. Returns it."""
    trainer = module.trainer
    if trainer.world_size > 1:
        totals = torch.stack([weighted_loss, torch.tensor(weight).to(weighted_loss)])
        weighted_loss, weight = trainer.strategy.reduce(totals, reduce_op="sum").unbind()
    mean = weighted_loss / weight
    module.log("train/loss", mean, prog_bar=True, batch_size=sequences)
    module.log_dict({f"train/{k}": v for k, v in module.derived_metrics(mean).items()}, batch_size=sequences)
    return mean


def log_epoch(module: LightningModule, stage: str) -> None:
    """Log the epoch means of ``stage``: ``{stage}/loss`` (``train/epoch_loss``: ``train/loss``
    is the per-batch value), the metrics derived from it (``module.derived_metrics``, evaluation stages
    only) and the torchmetrics; then reset them."""
    mean_loss, metrics = getattr(module, f"{stage}_mean_loss"), getattr(module, f"{stage}_metrics")
    if mean_loss.update_count == 0:
        return
    loss = mean_loss.compute()
    values = {f"{stage}/{'epoch_loss' if stage == 'train' else 'loss'}": loss}
    if stage != "train":
        values.update({f"{stage}/{k}": v for k, v in module.derived_metrics(loss).items()})
    if metrics is not None:
        values.update(metrics.compute())
    # Fresh states outside inference mode: Trainer.validate/test run under it, and states
    # made there could not be updated in place by a later fit's validation (which runs without it).
    with torch.inference_mode(False):
        if metrics is not None:
            metrics.reset()
        mean_loss.reset()
    # torchmetrics' compute() already synced the values across processes, so averaging
    # them again changes nothing; it tells Lightning they are global.
    module.log_dict(values, prog_bar=stage == "val", sync_dist=True)


def metrics_like_parameters(module: LightningModule) -> None:
    """float64 metric states for a float64 model (torchmetrics keeps float32 through
    ``.double()``, which rounds an epoch mean to about 1e-7), and float32 ones, not bf16/fp16,
    for a low-precision model: ``Trainer(precision="bf16-true")`` (``"16-true"``) converts
    the metrics' float states with the model, and a bf16 sum stops growing once it is large."""
    float64 = any(p.dtype == torch.float64 for p in module.parameters())
    # outside inference mode (Trainer.validate/test run under it), as in log_epoch
    with torch.inference_mode(False):
        for metric in module.modules():
            if not isinstance(metric, Metric):
                continue
            if float64:
                metric.set_dtype(torch.float64)
            elif any(t.dtype in (torch.bfloat16, torch.float16) for t in _state_tensors(metric)):
                metric.to(torch.float32)  # float states only: counts stay integers


def _state_tensors(metric: Metric) -> list[torch.Tensor]:
    """A torchmetrics Metric's state tensors (list states flattened)."""
    tensors = []
    for value in metric.metric_state.values():
        tensors.extend(value if isinstance(value, list) else [value])
    return tensors
