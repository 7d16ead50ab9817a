"""The optimizer and scheduler a module builds from its factories, and its plateau schedules."""
from __future__ import annotations

import functools
from typing import Callable

import torch
from lightning.pytorch.utilities import rank_zero_warn

from .schedules import BudgetCosine, follow_trainer

#: What a ReduceLROnPlateau scheduler is stepped with.
PLATEAU_METRIC = "val/loss"


def is_plateau(scheduler) -> bool:
    return isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)


def configure_optimization(optimizer: Callable, scheduler: Callable | None, params: list, interval: str,
                           automatic: bool, trainer=None):
    """What ``configure_optimizers`` returns: ``optimizer(params)``, and ``scheduler`` of it
    stepped every ``interval`` ("step": optimizer step, "epoch") where given.

    A ReduceLROnPlateau steps after each validation in fit instead, with ``val/loss``
    (:func:`step_plateaus`): stepped per optimizer step it would read a stale ``val/loss``.
    Its "epoch" is for LearningRateMonitor, which logs the rate at each epoch start; under
    automatic optimization Lightning is told it is no plateau scheduler, so that it neither
    wants a ``monitor`` nor steps it at epoch ends (the module's ``lr_scheduler_step`` skips it).
    """
    optimizer = optimizer(params)
    if scheduler is None:
        return optimizer
    scheduler = scheduler(optimizer)
    if trainer is not None:
        follow_trainer(scheduler, trainer)  # a schedule over the run's budget reads its progress
    if isinstance(scheduler, torch.optim.lr_scheduler.CosineAnnealingLR) and scheduler.T_max < 1:
        raise ValueError(
            f"scheduler: CosineAnnealingLR needs T_max >= 1 (scheduler steps), got {scheduler.T_max}; "
            "on the command line T_max follows trainer.max_steps: set trainer.max_steps, or "
            "model.scheduler.T_max for a run bounded by epochs"
        )
    if isinstance(scheduler, BudgetCosine):
        interval = "step"  # its warm-up counts optimizer steps, and its progress moves with every one
    if not is_plateau(scheduler):
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": interval}}
    config = {"scheduler": scheduler, "interval": "epoch"}
    if automatic:
        config["reduce_on_plateau"] = False
    return {"optimizer": optimizer, "lr_scheduler": config}


def step_plateaus(trainer) -> None:
    """Step every ReduceLROnPlateau with ``val/loss``, after a validation of fit (not the
    sanity check) that logged it."""
    if trainer.state.fn != "fit" or trainer.sanity_checking or PLATEAU_METRIC not in trainer.callback_metrics:
        return
    value = float(trainer.callback_metrics[PLATEAU_METRIC])
    for config in trainer.lr_scheduler_configs:
        if is_plateau(config.scheduler):
            config.scheduler.step(value)


def warn_unstepped_plateaus(trainer) -> None:
    """A warning at the end of a fit in which a ReduceLROnPlateau never stepped."""
    if any(is_plateau(c.scheduler) and c.scheduler.last_epoch == 0 for c in trainer.lr_scheduler_configs):
        rank_zero_warn(
            f"scheduler: ReduceLROnPlateau steps after each validation with {PLATEAU_METRIC}, and no "
            "validation ran in this fit (give the Trainer validation data, or another scheduler)"
        )


def _get_learning_rate(module) -> float:
    factory = module.__dict__.get("_optimizer_factory")
    if not isinstance(factory, functools.partial) or "lr" not in factory.keywords:
        raise AttributeError(f"lr: the optimizer factory {factory!r} is not a functools.partial with an lr")
    return factory.keywords["lr"]


def _set_learning_rate(module, value: float) -> None:
    factory = module.__dict__.get("_optimizer_factory")
    if not isinstance(factory, functools.partial):
        raise AttributeError(f"lr: the optimizer factory {factory!r} is not a functools.partial")
    module._optimizer_factory = functools.partial(factory.func, *factory.args, **{**factory.keywords, "lr": value})
    if "optimizer" in module.hparams:
        module.hparams["optimizer"] = module._optimizer_factory


factory_learning_rate = property(_get_learning_rate, _set_learning_rate, doc="""
    The learning rate of the module's optimizer factory (a ``functools.partial`` with ``lr``).
    Settable: Lightning's ``Tuner(trainer).lr_find(model)`` reads it and writes its suggestion
    here, which the next ``configure_optimizers`` (and the checkpoint's hyperparameters) use.""")
