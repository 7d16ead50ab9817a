"""Lightning's rich progress bar, labelled sensibly for runs limited by steps."""
from __future__ import annotations

from lightning.pytorch.callbacks import RichProgressBar


class StepLimitedProgressBar(RichProgressBar):
    """:class:`~lightning.pytorch.callbacks.RichProgressBar` whose training bar reads
    ``Epoch 3`` when the run has no epoch limit (``max_epochs=-1``, the run stops at
    ``max_steps``). Lightning labels it ``Epoch 3/-2`` there (``max_epochs - 1``).
    Runs with an epoch limit keep Lightning's ``Epoch 3/9``.

    The logger's version shows as ``v_num: 0``: Lightning's rich bar formats every
    number as a float, ``v_num: 0.000`` for a CSV or TensorBoard logger's version 0."""

    def get_metrics(self, trainer, pl_module) -> dict:
        items = super().get_metrics(trainer, pl_module)
        if isinstance(items.get("v_num"), int):
            items["v_num"] = str(items["v_num"])
        return items

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        super().on_train_epoch_start(trainer, pl_module)
        max_epochs = trainer.max_epochs
        if max_epochs is None or max_epochs >= 0 or self.progress is None or self.train_progress_bar_id is None:
            return
        description = f"Epoch {trainer.current_epoch}"
        # padded like Lightning's, so the bar does not shift when validation's bar shows
        self.progress.update(self.train_progress_bar_id, description=f"{description:{len(self.validation_description)}}")
        self.refresh()
