"""A callback that stops a CLI run in its tracks, for a test to kill it there.

Added as ``+callbacks.stall._target_=stall_callback.StallAfterStep +callbacks.stall.step=N
+callbacks.stall.marker=FILE`` (this folder on PYTHONPATH): after optimizer step N it creates
FILE and then waits, doing nothing, until the process is killed.
"""
from __future__ import annotations

import time
from pathlib import Path

from lightning.pytorch import Callback


class StallAfterStep(Callback):
    def __init__(self, step: int, marker: str):
        self.step, self.marker = step, Path(marker)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            self.marker.touch()
            while True:  # killed here
                time.sleep(1)
