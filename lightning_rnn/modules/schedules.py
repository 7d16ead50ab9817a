"""A learning-rate schedule over the run's budget: warm-up, then cosine to the end of the run.

Step-count schedules (torch's CosineAnnealingLR over ``max_steps``) need the run's length
in optimizer steps, which a user who gives a time budget (``trainer.max_time``) does not
know. :class:`BudgetCosine` decays over the run's *progress*: the larger of the fraction of
its optimizer steps taken (from ``max_steps`` or ``max_epochs``) and of ``max_time``
elapsed (Lightning's Timer, which a resumed run restores), as the Trainer that runs it
reports them; so a budget given in any of these units is followed, and the rate reaches
its floor as the run ends. The module hands it the Trainer (:func:`follow_trainer`).
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from lightning.pytorch.callbacks import Timer

from ..utils.checks import check_int, check_number


class BudgetCosine(torch.optim.lr_scheduler.LRScheduler):
    """``lr = base_lr * f``: f rises linearly from ``1 / warmup_steps`` to 1 over the first
    ``warmup_steps`` optimizer steps, then follows a cosine from 1 to ``min_ratio`` as the
    run's progress goes from 0 to 1 (stepped once per optimizer step).

    Args:
        optimizer: the optimizer whose rates it sets.
        warmup_steps: optimizer steps of linear warm-up (0: none).
        min_ratio: the rate at the end of the budget, as a fraction of the base rate.
        progress: a callable giving the run's progress in [0, 1]; :func:`follow_trainer` sets
            it to the Trainer's. Without one the schedule stays at the warmed-up rate.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, warmup_steps: int = 0, min_ratio: float = 0.0,
                 progress: Callable[[], float] | None = None, last_epoch: int = -1):
        self.warmup_steps = check_int("warmup_steps", warmup_steps, 0)
        self.min_ratio = check_number("min_ratio", min_ratio, 0, 1)
        self.progress = progress
        super().__init__(optimizer, last_epoch)

    def factor(self, step: int, progress: float) -> float:
        """The rate's multiplier after ``step`` optimizer steps at ``progress``."""
        warm = min(1.0, (step + 1) / self.warmup_steps) if self.warmup_steps else 1.0
        cosine = 0.5 * (1 + math.cos(math.pi * min(max(progress, 0.0), 1.0)))
        return warm * (self.min_ratio + (1 - self.min_ratio) * cosine)

    def get_lr(self) -> list[float]:
        progress = self.progress() if self.progress is not None else 0.0
        return [base * self.factor(self.last_epoch, progress) for base in self.base_lrs]

    def state_dict(self) -> dict:
        return {k: v for k, v in super().state_dict().items() if k != "progress"}


def trainer_progress(trainer) -> float:
    """The run's progress in [0, 1]: the larger of the fraction of the optimizer steps the
    Trainer will take (``estimated_stepping_batches``: from ``max_steps``, or ``max_epochs``
    and the loader's length, with accumulation) and the fraction of ``max_time`` elapsed
    (its Timer); 0 where it has neither bound."""
    fractions = [0.0]
    total = trainer.estimated_stepping_batches
    if total and math.isfinite(total):
        fractions.append(trainer.global_step / total)
    timer = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)
    if timer is not None:
        elapsed, remaining = timer.time_elapsed("train"), timer.time_remaining("train")
        if remaining is not None and elapsed + remaining > 0:
            fractions.append(elapsed / (elapsed + remaining))
    return min(max(fractions), 1.0)


def follow_trainer(scheduler, trainer) -> None:
    """A :class:`BudgetCosine` takes its progress from ``trainer``; other schedulers are left as they are."""
    if isinstance(scheduler, BudgetCosine):
        scheduler.progress = lambda: trainer_progress(trainer)
