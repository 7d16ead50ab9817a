"""torch-rnn's batch layout: every batch row reads its own contiguous stream of text."""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ..utils.checks import check_int


class ContiguousStreams(IterableDataset):
    """Batches of ``(batch_size, seq_len)`` windows in which row ``b`` of batch ``i + 1``
    continues row ``b`` of batch ``i``, so a hidden state carried across batches sees
    unbroken text (torch-rnn / char-rnn's layout).

    The token sequence is cut into ``batch_size * world_size`` equal streams; process
    ``rank`` owns streams ``rank * batch_size ... (rank + 1) * batch_size - 1``. With one
    process and batch ``B * W``, or ``W`` processes and batch ``B`` each, the global
    batch is identical. Being an ``IterableDataset`` it yields whole batches (load it
    with :class:`StreamLoader`, which Lightning can resume mid-epoch, or
    ``DataLoader(batch_size=None)``) and Lightning does not re-shard it.

    Yields:
        dict with ``inputs`` and ``targets``: ``(batch_size, seq_len)`` int64, targets
        being the inputs shifted by one character.
    """

    def __init__(self, tokens: torch.Tensor, batch_size: int, seq_len: int, rank: int = 0, world_size: int = 1):
        super().__init__()
        if tokens.dim() != 1:
            raise ValueError(f"tokens: expected a 1-D tensor of ids, got shape {tuple(tokens.shape)}")
        batch_size, seq_len = check_int("batch_size", batch_size, 1), check_int("seq_len", seq_len, 1)
        world_size = check_int("world_size", world_size, 1)
        rank = check_int("rank", rank, 0, maximum=world_size - 1)
        num_streams = batch_size * world_size
        self.num_batches = (tokens.numel() - 1) // (num_streams * seq_len)
        if self.num_batches < 1:
            raise ValueError(
                f"tokens: {tokens.numel()} tokens are too few for {num_streams} streams of seq_len={seq_len}"
            )
        used = num_streams * self.num_batches * seq_len
        streams = slice(rank * batch_size, (rank + 1) * batch_size)
        self.inputs = tokens[:used].view(num_streams, -1)[streams]  # (B, num_batches * seq_len)
        self.targets = tokens[1 : used + 1].view(num_streams, -1)[streams]
        self.seq_len = seq_len
        self.first_batch = 0  # where the next pass starts (a resumed epoch); back to 0 after it

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self):
        start, self.first_batch = self.first_batch, 0
        # DataLoader workers: worker k yields batches start + k, start + k + W, ...; the loader
        # takes one from each worker in turn, so the batches still arrive in order (each once).
        info = get_worker_info()
        offset, step = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(start + offset, self.num_batches, step):
            window = slice(i * self.seq_len, (i + 1) * self.seq_len)
            yield {"inputs": self.inputs[:, window], "targets": self.targets[:, window]}


class ResumableLoader(DataLoader):
    """A DataLoader that a Lightning run resumes exactly, also in the middle of an epoch.

    - Lightning saves its :meth:`state_dict` in checkpoints: how many batches of the current
      pass the training loop has consumed, as ``batches_done()`` tells (the Trainer's count,
      see :func:`trainer_batches_done`; the loader itself runs ahead of it by the batches
      Lightning prefetches). After :meth:`load_state_dict` the next pass starts at the next
      unseen batch (a plain DataLoader would start the pass over, reading the epoch's first
      batches twice and its last ones not at all).
    - Its ``generator`` (made for ``shuffle=True`` when none is given) is seeded with
      ``seed + epoch`` at the start of each pass, ``epoch()`` being the Trainer's epoch (the
      passes so far where ``epoch`` is None or returns None), so a shuffled order depends on
      the seed and the epoch only, as a DistributedSampler's does: a resumed run draws the
      orders the uninterrupted one drew (a plain shuffling DataLoader draws them from the
      global random state, which a new process does not share). ``seed`` defaults to
      ``torch.initial_seed()`` (the one ``seed_everything`` set).

    The rest of the arguments are DataLoader's.
    """

    def __init__(self, dataset, *args, batches_done: Callable[[], int] | None = None,
                 epoch: Callable[[], int] | None = None, seed: int | None = None, **kwargs):
        if kwargs.get("shuffle") and kwargs.get("generator") is None:
            kwargs["generator"] = torch.Generator()
        super().__init__(dataset, *args, **kwargs)
        self.batches_done, self.epoch = batches_done, epoch
        self.seed = torch.initial_seed() if seed is None else int(seed)
        self._passes = 0
        self._resume_at = 0

    def state_dict(self) -> dict:
        return {"batches_done": self.batches_done() if self.batches_done is not None else 0}

    def load_state_dict(self, state: dict) -> None:
        done = int(state.get("batches_done", 0))
        self._resume_at = done if 0 < done < len(self) else 0  # a finished pass: start the next

    def __iter__(self):
        # Set up at the first batch, not here: Lightning creates the iterator of a resumed epoch
        # before it has restored its epoch number.
        epoch = self.epoch() if self.epoch is not None else None
        epoch, self._passes = (self._passes if epoch is None else epoch), self._passes + 1
        if self.generator is not None:
            self.generator.manual_seed((self.seed + epoch) % 2**64)
        skip, self._resume_at = self._resume_at, 0
        yield from self._start(skip)

    def _start(self, skip: int):
        """The iterator of a pass that leaves out its first ``skip`` batches (loaded, not used)."""
        iterator = super().__iter__()
        for _ in range(skip):
            next(iterator)
        return iterator


class StreamLoader(ResumableLoader):
    """The :class:`ResumableLoader` of :class:`ContiguousStreams` (whole batches,
    ``batch_size=None``): a resumed pass starts at its next unseen batch without reading the
    ones before it."""

    def __init__(self, streams: ContiguousStreams, batches_done: Callable[[], int] | None = None, **kwargs):
        super().__init__(streams, batch_size=None, batches_done=batches_done, **kwargs)

    def _start(self, skip: int):
        self.dataset.first_batch = skip
        iterator = DataLoader.__iter__(self)  # workers, if any, take their copy of the dataset here
        if self.num_workers > 0:
            self.dataset.first_batch = 0
        return iterator


def trainer_batches_done(trainer) -> int:
    """Batches of the current training epoch ``trainer`` has run; 0 without a Trainer or once
    the epoch's batches (``limit_train_batches`` of them, if set) are all done, so that a run
    resumed from the end of an epoch starts the next one at its first batch."""
    if trainer is None:
        return 0
    done = trainer.fit_loop.epoch_loop.batch_idx + 1
    return 0 if done >= trainer.num_training_batches else done
