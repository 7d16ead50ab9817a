"""Logging generated text to whichever loggers the Trainer has."""
from __future__ import annotations

from typing import Sequence

from lightning.pytorch.loggers import Logger, TensorBoardLogger, WandbLogger


def log_text_samples(loggers: list[Logger], key: str, rows: Sequence[tuple[int, str]]) -> bool:
    """Log ``rows`` of ``(step, text)``: a wandb.Table of them, or the newest
    row as TensorBoard text. Other loggers have no text support and are skipped.
    Returns whether any logger took the text."""
    step, text = rows[-1]
    taken = False
    for logger in loggers:
        if isinstance(logger, WandbLogger):
            logger.log_text(key=key, columns=["step", "text"], data=[list(row) for row in rows])
        elif isinstance(logger, TensorBoardLogger):
            logger.experiment.add_text(key, text, global_step=step)
        else:
            continue
        taken = True
    return taken
