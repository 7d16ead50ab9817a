"""The few Lightning internals this package relies on, where Lightning has no public API.

Each is used through one function here, and each has a test in tests/utils/test_compat.py
that fails when a Lightning release changes it (pyproject.toml bounds the Lightning versions
the suite passed with). Everything else uses Lightning's public API.
"""
from __future__ import annotations

from contextlib import ExitStack, contextmanager

from torch.utils.data import BatchSampler, DataLoader


def train_dataloader_source(trainer):
    """Where ``trainer.fit`` takes its train dataloader from (``trainer.fit_loop._data_source``),
    read after the ``setup`` hooks: ``.is_module()`` (a ``train_dataloader`` hook of the
    LightningModule or LightningDataModule ``.instance``, named ``.name``) or else the loader
    given to ``fit`` as ``.instance``. A callback that replaces the train loader has no public
    way to reach a loader passed to ``fit``."""
    return trainer.fit_loop._data_source


@contextmanager
def recording_loader_arguments():
    """DataLoaders and batch samplers made inside record their constructor arguments, as
    Lightning records those made in its dataloader hooks, so that under DDP Lightning can
    re-create them around its DistributedSampler (``_replace_dunder_methods``)."""
    from lightning.fabric.utilities.data import _replace_dunder_methods

    with ExitStack() as stack:
        stack.enter_context(_replace_dunder_methods(DataLoader, "dataset"))
        stack.enter_context(_replace_dunder_methods(BatchSampler))
        yield


def set_logged_batch_size(trainer, batch_size: int) -> None:
    """The batch size ``LightningModule.log`` uses for the current batch where a call gives
    none (``trainer._results.batch_size``; Lightning would otherwise infer it from the first
    tensor it finds in the batch, e.g. a PackedSequence's rows)."""
    results = trainer._results
    if results is not None:
        results.batch_size = batch_size


def load_checkpoint_file(path_or_url, weights_only: bool | None) -> dict:
    """Lightning's reader of a checkpoint path, URL (fsspec) or file object, on CPU
    (``lightning.fabric.utilities.cloud_io._load``, which ``load_from_checkpoint`` uses)."""
    from lightning.fabric.utilities.cloud_io import _load

    return _load(path_or_url, map_location="cpu", weights_only=weights_only)


def skip_hyperparameter_logging(module) -> None:
    """The Trainer logs none of ``module``'s hyperparameters (what
    ``save_hyperparameters(logger=False)`` sets, ``module._log_hyperparams``), for a module
    built by a caller that logs its own record of the run's settings."""
    module._log_hyperparams = False


def switch_to_manual_optimization(module) -> None:
    """Call from the module's ``setup`` hook: the run optimizes manually from here on.

    Lightning refuses ``Trainer(gradient_clip_val=..., accumulate_grad_batches=...)`` for a
    module that optimizes manually, checking ``automatic_optimization`` once per run, after
    ``configure_callbacks`` and before ``setup`` (``Trainer._run``). A module that applies
    those settings in its own loop stays automatic until ``setup``; its
    ``configure_callbacks`` switches it back for the next run, also after a run that raised
    (which skips ``teardown``)."""
    module.automatic_optimization = False
