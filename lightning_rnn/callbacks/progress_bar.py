"""Lightning's rich progress bar, with the run's throughput and learning rate, labelled
sensibly for runs limited by steps."""
from __future__ import annotations

import logging
import sys
import time
from collections import deque

from lightning.pytorch.callbacks import RichProgressBar

from ..utils.checks import check_int
from .gpu_memory import batch_tokens


class StepLimitedProgressBar(RichProgressBar):
    """:class:`~lightning.pytorch.callbacks.RichProgressBar` that also shows

    - ``tokens/s``: tokens (time steps of every sequence: the real ones where batches carry
      ``lengths``) per second of training step (forward, backward and optimizer step; data
      loading and validation are not counted), over the last ``tokens_window`` steps, for all
      processes together (this process's rate times the processes of a DDP run);
    - ``lr``: the learning rate of the first optimizer's first parameter group, as the
      optimizer holds it now (after the scheduler's last step).

    Its training bar reads ``Epoch 3`` when the run has no epoch limit (``max_epochs=-1``, the
    run stops at ``max_steps``). Lightning labels it ``Epoch 3/-2`` there (``max_epochs - 1``).
    Runs with an epoch limit keep Lightning's ``Epoch 3/9``.

    The logger's version shows as ``v_num: 0``: Lightning's rich bar formats every
    number as a float, ``v_num: 0.000`` for a CSV or TensorBoard logger's version 0.

    In a terminal, log lines that the root logger's console handlers (Hydra's, in a
    command-line run) write while the bar is drawn are printed above the bar, as ``print``
    is: written to the terminal directly they would land inside the bar's lines.

    Args:
        tokens_window: training steps the tokens/s figure is averaged over.
        **kwargs: :class:`~lightning.pytorch.callbacks.RichProgressBar`'s arguments.
    """

    def __init__(self, tokens_window: int = 20, **kwargs):
        super().__init__(**kwargs)
        self.tokens_window = check_int("tokens_window", tokens_window, 1)
        self._steps: deque[tuple[int, float]] = deque(maxlen=self.tokens_window)  # (tokens, seconds) per step
        self._step_start: float | None = None
        self._step_tokens = 0
        self._console_handlers: dict[logging.StreamHandler, object] = {}  # handler -> its own stream

    def tokens_per_second(self, world_size: int = 1) -> float | None:
        """Tokens per second over the last ``tokens_window`` training steps, times
        ``world_size``; None before the first step (or for batches of no known tokens)."""
        tokens, seconds = sum(t for t, _ in self._steps), sum(s for _, s in self._steps)
        return tokens * world_size / seconds if tokens and seconds > 0 else None

    def get_metrics(self, trainer, pl_module) -> dict:
        items = super().get_metrics(trainer, pl_module)
        if isinstance(items.get("v_num"), int):
            items["v_num"] = str(items["v_num"])
        rate = self.tokens_per_second(trainer.world_size)
        if rate is not None:
            items["tokens/s"] = short_number(rate)
        if trainer.optimizers:
            items["lr"] = f"{trainer.optimizers[0].param_groups[0]['lr']:.3g}"
        return items

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        self._step_tokens = batch_tokens(batch)
        self._step_start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if self._step_start is not None:  # recorded before the bar's own update shows it
            self._steps.append((self._step_tokens, time.perf_counter() - self._step_start))
            self._step_start = None
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_train_start(self, trainer, pl_module) -> None:
        super().on_train_start(trainer, pl_module)
        self._log_above_the_bar()

    def on_validation_start(self, trainer, pl_module) -> None:
        super().on_validation_start(trainer, pl_module)
        self._log_above_the_bar()

    def on_test_start(self, trainer, pl_module) -> None:
        super().on_test_start(trainer, pl_module)
        self._log_above_the_bar()

    def on_predict_start(self, trainer, pl_module) -> None:
        super().on_predict_start(trainer, pl_module)
        self._log_above_the_bar()

    def teardown(self, trainer, pl_module, stage: str) -> None:
        super().teardown(trainer, pl_module, stage)
        self._restore_console_handlers()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        super().on_exception(trainer, pl_module, exception)
        self._restore_console_handlers()

    def _log_above_the_bar(self) -> None:
        """Point the root logger's console handlers at rich's stand-ins for stdout/stderr,
        which the drawn bar puts in their place in a terminal (elsewhere: nothing to do)."""
        for stream in (sys.stdout, sys.stderr):
            terminal = getattr(stream, "rich_proxied_file", None)
            if terminal is None:
                continue
            for handler in logging.getLogger().handlers:
                if type(handler) is logging.StreamHandler and handler.stream is terminal:
                    self._console_handlers.setdefault(handler, terminal)
                    handler.setStream(stream)

    def _restore_console_handlers(self) -> None:
        for handler, stream in self._console_handlers.items():
            handler.setStream(stream)
        self._console_handlers.clear()

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        super().on_train_epoch_start(trainer, pl_module)
        max_epochs = trainer.max_epochs
        if max_epochs is None or max_epochs >= 0 or self.progress is None or self.train_progress_bar_id is None:
            return
        description = f"Epoch {trainer.current_epoch}"
        # padded like Lightning's, so the bar does not shift when validation's bar shows
        self.progress.update(self.train_progress_bar_id, description=f"{description:{len(self.validation_description)}}")
        self.refresh()


def short_number(value: float) -> str:
    """``value`` with a k/M/G suffix and three digits or more: 950, 12.3k, 1.50M."""
    suffix, scale = next(((s, f) for s, f in (("G", 1e9), ("M", 1e6), ("k", 1e3)) if value >= f), ("", 1.0))
    scaled = value / scale
    decimals = 0 if scaled >= 100 else 1 if scaled >= 10 else 2
    return f"{scaled:.{decimals}f}{suffix}"
