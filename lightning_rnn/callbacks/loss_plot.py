"""LossPlot: a PNG of the training and validation loss against wall-clock time, written
when fit ends, which a user opens without any logger's viewer."""
from __future__ import annotations

import logging
import math
import time
from pathlib import Path

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.trainer.states import TrainerFn

log = logging.getLogger(__name__)


class LossPlot(Callback):
    """Record ``train_key`` and ``val_key`` as the module logs them, against the seconds since
    fit started, and draw both into ``path`` (a PNG, through matplotlib's Agg backend: no
    display needed) when fit ends, also when it stops on an error or Ctrl-C. A resumed run
    plots its own part, its time counted from its own start.

    The training loss is read every ``trainer.log_every_n_steps`` training batches (as the
    loggers record it), the validation loss after every validation; on the first process of
    a DDP run only, which writes the file.

    Args:
        path: the PNG to write; None: ``loss.png`` in the Trainer's ``default_root_dir``.
        train_key: the logged training loss (a per-step value).
        val_key: the logged validation loss.

    Example::

        Trainer(callbacks=[LossPlot("runs/loss.png")]).fit(model, datamodule=data)
    """

    def __init__(self, path: str | Path | None = None, train_key: str = "train/loss", val_key: str = "val/loss"):
        self.path = None if path is None else Path(path)
        self.train_key, self.val_key = train_key, val_key
        self.train: list[tuple[float, float]] = []  # (seconds since fit started, loss)
        self.val: list[tuple[float, float]] = []
        self._start = time.perf_counter()
        self._batches = 0

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.train, self.val, self._batches = [], [], 0
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        self._batches += 1
        if trainer.is_global_zero and self._batches % max(trainer.log_every_n_steps, 1) == 0:
            self._record(trainer, self.train_key, self.train)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.is_global_zero and not trainer.sanity_checking and trainer.state.fn == TrainerFn.FITTING:
            self._record(trainer, self.val_key, self.val)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._write(trainer)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if trainer.state.fn == TrainerFn.FITTING:
            self._write(trainer)

    def _record(self, trainer: Trainer, key: str, points: list[tuple[float, float]]) -> None:
        value = trainer.callback_metrics.get(key)
        if value is not None and math.isfinite(float(value)):
            points.append((time.perf_counter() - self._start, float(value)))

    def _write(self, trainer: Trainer) -> None:
        if not trainer.is_global_zero:
            return
        if not self.train and not self.val:
            log.warning("LossPlot: %s and %s were never logged in this run: no plot written", self.train_key,
                        self.val_key)
            return
        path = self.path if self.path is not None else Path(trainer.default_root_dir) / "loss.png"
        draw_losses(path, {self.train_key: self.train, self.val_key: self.val})
        log.info("loss plot: %s", path)


def draw_losses(path: Path, curves: dict[str, list[tuple[float, float]]]) -> None:
    """Draw ``curves`` (name -> (seconds, loss) points) into the PNG ``path``, the time in
    seconds, minutes or hours as the run's length suits."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    end = max(t for points in curves.values() for t, _ in points)
    unit, scale = ("s", 1.0) if end < 120 else ("min", 60.0) if end < 7200 else ("h", 3600.0)
    figure = Figure(figsize=(7, 4.5), dpi=100, layout="constrained")
    axes = figure.add_subplot()
    for (name, points), width in zip(curves.items(), (1.0, 1.5)):
        if points:  # markers where there are few points (a single one draws no line)
            marker = {"marker": "o", "markersize": 3} if len(points) <= 50 else {}
            axes.plot([t / scale for t, _ in points], [v for _, v in points], label=name, linewidth=width, **marker)
    axes.set_xlim(left=0)
    axes.set_xlabel(f"wall-clock time since the run started ({unit})")
    axes.set_ylabel("loss")
    axes.grid(alpha=0.3)
    axes.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(figure).print_png(str(path))
