"""PackedSequences: variable-length training without paying for padding.

Batch convention: a dict with ``inputs`` — padded, batch-first ``(B, T, ...)`` — and
``lengths`` ``(B,)`` (int), plus anything else (``targets`` ...). This is what
:mod:`lightning_rnn.data` collates and what :class:`~lightning_rnn.modules.RNNModule`
consumes. The callback

1. installs a :class:`LengthBucketBatchSampler` on the train dataloader (batches of
   similar lengths, shuffled buckets), so little padding is loaded and the fused layers
   run few steps per batch;
2. replaces ``batch["inputs"]`` (and any other ``pack_keys``) with a ``PackedSequence``
   before every train/val/test step (``lengths`` stays in the batch), which the fused
   layers consume directly, computing only the real tokens;
3. tells Lightning the batch size is ``len(lengths)`` (Lightning would otherwise infer the
   number of packed rows from the PackedSequence);
4. logs ``packed/padding_efficiency`` (real / padded tokens of the loaded batch) and
   ``packed/tokens_per_sec`` (real tokens per second of the training step: forward,
   backward and optimizer; data loading and validation are not counted).

The train dataloader must be a ``torch.utils.data.DataLoader`` with a ``batch_size`` over a
map-style dataset; sequence lengths come from ``dataset.lengths`` if it has one, else from
each item's ``lengths_key`` or ``len(dataset[i][inputs_key])`` (one pass over the dataset at
setup). ``predict`` batches are left as they are (padded). After fit — also when it
raises — the dataloader source is as it was. Under DDP, Lightning
re-creates the batch sampler around its DistributedSampler, whether the dataloader comes from a
``train_dataloader()`` hook or is passed to ``fit``: each process buckets its own shard.
"""
from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence
from torch.utils.data import DataLoader, IterableDataset

from ..data.samplers import LengthBucketBatchSampler
from ..data.streams import ResumableLoader
from ..utils import compat
from ..utils.checks import check_flag, check_int


def dataset_lengths(dataset, key: str, lengths_key: str = "lengths") -> torch.Tensor:
    """(len(dataset),) sequence lengths: ``dataset.lengths``, else each dict item's
    ``lengths_key`` (items padded already) or ``len(item[key])``; a TypeError that says how
    to give them when the dataset has none of these."""
    lengths = getattr(dataset, "lengths", None)
    if lengths is not None:
        return torch.as_tensor(lengths, dtype=torch.long)
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
        raise TypeError(
            f"PackedSequences: bucketing needs a map-style dataset (len and indexing), got {type(dataset).__name__}; "
            "pass bucketing=False to only pack the batches"
        )
    try:
        items = (dataset[i] for i in range(len(dataset)))
        lengths = [int(item[lengths_key]) if lengths_key in item else len(item[key]) for item in items]
    except (TypeError, KeyError, IndexError, RuntimeError) as err:  # RuntimeError: `key in tensor`
        raise TypeError(
            f"PackedSequences: cannot read the sequence lengths of {type(dataset).__name__}'s items ({err!r}); "
            f"give the dataset a `lengths` attribute (one int per item) or make its items dicts with "
            f"{key!r} (T, ...) and optionally {lengths_key!r}"
        ) from err
    return torch.as_tensor(lengths, dtype=torch.long)


#: DataLoader settings of newer torch versions than the oldest supported (in_order: 2.6).
_NEWER_LOADER_SETTINGS = ("pin_memory_device", "in_order")


class PackedSequences(Callback):
    """Length bucketing on the train dataloader and packed inputs for every step.

    Args:
        bucket_size: sequences sorted by length together (see LengthBucketBatchSampler);
            None: 50 batches' worth.
        bucketing: install the bucketing batch sampler on the train dataloader (False: only
            pack the batches, keep the dataloader as it is).
        shuffle: shuffle the order of the bucketed batches.
        inputs_key: key of the padded inputs in the batch dict.
        lengths_key: key of the lengths.
        pack_keys: keys packed into PackedSequences (default: ``inputs_key`` only).
    """

    def __init__(
        self,
        bucket_size: int | None = None,
        bucketing: bool = True,
        shuffle: bool = True,
        inputs_key: str = "inputs",
        lengths_key: str = "lengths",
        pack_keys: list[str] | tuple[str, ...] | None = None,
    ):
        self.bucket_size = check_int("bucket_size", bucket_size, 1, optional=True)
        self.bucketing, self.shuffle = check_flag("bucketing", bucketing), check_flag("shuffle", shuffle)
        for name, key in (("inputs_key", inputs_key), ("lengths_key", lengths_key)):
            if not isinstance(key, str):
                raise TypeError(f"{name}: expected a batch key (a str), got {key!r}")
        self.inputs_key, self.lengths_key = inputs_key, lengths_key
        if isinstance(pack_keys, str):
            pack_keys = (pack_keys,)
        if pack_keys is not None and (not isinstance(pack_keys, Sequence) or not all(isinstance(k, str) for k in pack_keys)):
            raise TypeError(f"pack_keys: expected a list of batch keys, got {pack_keys!r}")
        self.pack_keys = tuple(pack_keys) if pack_keys is not None else (inputs_key,)
        self._restore = None
        self._step_start = 0.0

    # ----- train dataloader ---------------------------------------------------------
    def bucketed(self, loader: DataLoader) -> DataLoader:
        """A copy of ``loader`` that draws its batches from a LengthBucketBatchSampler (shuffled
        with the loader's generator; a :class:`~lightning_rnn.data.ResumableLoader`, as the data
        modules' train loaders are, stays one, so a resumed run gets the batches it had)."""
        if not isinstance(loader, DataLoader) or loader.batch_size is None:
            raise TypeError(
                "PackedSequences: the train dataloader must be a torch DataLoader with a batch_size "
                f"(bucketing replaces its batch sampler), got {type(loader).__name__}"
            )
        sampler = LengthBucketBatchSampler(  # checks that bucket_size is at least the batch size
            loader.sampler, loader.batch_size, loader.drop_last,
            lengths=dataset_lengths(loader.dataset, self.inputs_key, self.lengths_key),
            bucket_size=self.bucket_size,
            shuffle=self.shuffle,
            generator=loader.generator,
        )
        resumable = isinstance(loader, ResumableLoader)
        newer = {key: getattr(loader, key) for key in _NEWER_LOADER_SETTINGS if hasattr(loader, key)}
        return (ResumableLoader if resumable else DataLoader)(
            loader.dataset, batch_sampler=sampler, num_workers=loader.num_workers, collate_fn=loader.collate_fn,
            pin_memory=loader.pin_memory, timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
            multiprocessing_context=loader.multiprocessing_context, generator=loader.generator,
            prefetch_factor=loader.prefetch_factor, persistent_workers=loader.persistent_workers, **newer,
            **(dict(batches_done=loader.batches_done, epoch=loader.epoch, seed=loader.seed) if resumable else {}),
        )

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit" or not self.bucketing or self._restore is not None:
            return
        # Lightning asks this source for the train dataloader after the setup hooks.
        source = compat.train_dataloader_source(trainer)
        if source.is_module():
            owner, name = source.instance, source.name
            original = getattr(owner, name)
            own = vars(owner).get(name)  # an instance attribute (LightningDataModule.from_datasets sets one)
            setattr(owner, name, lambda: self.bucketed(original()))
            self._restore = (lambda: setattr(owner, name, own)) if own is not None else (lambda: delattr(owner, name))
        else:
            loader = source.instance
            # As Lightning does around the hooks: record the init arguments, so that under DDP it can
            # re-create the batch sampler around its DistributedSampler (else: a TypeError, no `lengths`).
            with compat.recording_loader_arguments():
                source.instance = self.bucketed(loader)
            self._restore = lambda: setattr(source, "instance", loader)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit" and self._restore is not None:
            self._restore()
            self._restore = None

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self.teardown(trainer, pl_module, "fit")  # Lightning skips teardown when a run raises

    # ----- batches ------------------------------------------------------------------
    def pack(self, trainer: Trainer, batch: dict) -> tuple[int, int]:
        """Pack ``batch``'s ``pack_keys`` in place; returns (real tokens, padded tokens)."""
        if not isinstance(batch, dict) or self.lengths_key not in batch or self.inputs_key not in batch:
            raise TypeError(
                f"PackedSequences: expected dict batches with {self.inputs_key!r} (B, T, ...) and "
                f"{self.lengths_key!r} (B,), got {type(batch).__name__}"
                + (f" with keys {sorted(batch)}" if isinstance(batch, dict) else "")
            )
        lengths, inputs = batch[self.lengths_key], batch[self.inputs_key]
        real = int(lengths.sum())
        padded = real if isinstance(inputs, PackedSequence) else len(lengths) * inputs.shape[1]
        for key in self.pack_keys:
            if not isinstance(batch[key], PackedSequence):
                batch[key] = pack_padded_sequence(batch[key], lengths.cpu(), batch_first=True, enforce_sorted=False)
        compat.set_logged_batch_size(trainer, len(lengths))
        return real, padded

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int) -> None:
        self._tokens = self.pack(trainer, batch)
        self._step_start = time.perf_counter()

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        seconds = time.perf_counter() - self._step_start
        real, padded = self._tokens
        B = len(batch[self.lengths_key])
        pl_module.log("packed/padding_efficiency", real / max(padded, 1), batch_size=B)
        pl_module.log("packed/tokens_per_sec", real / max(seconds, 1e-9), batch_size=B)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.pack(trainer, batch)

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.pack(trainer, batch)
