"""Batch order: a sampler that puts sequences of similar length in the same batch, and
whether a loader keeps its rows in order."""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import BatchSampler, DistributedSampler, RandomSampler, Sampler

from ..utils.checks import check_int


class LengthBucketBatchSampler(BatchSampler):
    """Batches of similar lengths, in shuffled order.

    Each epoch the indices come from ``sampler`` (shuffled, and sharded under DDP:
    Lightning re-creates this class around its DistributedSampler), are cut into
    buckets of ``bucket_size`` indices, each bucket is sorted by length (longest
    first) and cut into batches of ``batch_size``, and all batches are shuffled.
    Larger buckets give less padding and less randomness in batch composition.

    Args:
        sampler: the index sampler, e.g. ``RandomSampler(dataset)``.
        batch_size: sequences per batch.
        drop_last: leave out ``N % batch_size`` sequences each epoch so that every batch is
            full: the last ones in ``sampler``'s order, as ``BatchSampler`` does (with a
            shuffling sampler, different ones each epoch).
        lengths: length of every sequence of the dataset, indexed like it.
        bucket_size: indices sorted together; default 50 batches.
        shuffle: shuffle the order of the batches (the training default).
        generator: the random generator of that shuffle (None: torch's global one).
    """

    def __init__(
        self,
        sampler: Sampler[int] | Sequence[int],
        batch_size: int,
        drop_last: bool,
        lengths: Sequence[int] | torch.Tensor,
        bucket_size: int | None = None,
        shuffle: bool = True,
        generator: torch.Generator | None = None,
    ):
        super().__init__(sampler, batch_size, drop_last)
        self.lengths = torch.as_tensor(lengths, dtype=torch.long)
        bucket_size = check_int("bucket_size", bucket_size, batch_size, optional=True)
        self.bucket_size = 50 * batch_size if bucket_size is None else bucket_size
        self.shuffle, self.generator = shuffle, generator

    def _longest_first(self, indices: torch.Tensor) -> torch.Tensor:
        return indices[torch.sort(self.lengths[indices], descending=True, stable=True).indices]

    def _batches(self) -> list[torch.Tensor]:
        indices = torch.as_tensor(list(self.sampler), dtype=torch.long)
        if len(indices) and not 0 <= int(indices.min()) <= int(indices.max()) < len(self.lengths):
            raise ValueError(f"lengths: expected one length per item of the dataset ({len(self.lengths)} given), but the "
                             f"sampler draws indices {int(indices.min())}..{int(indices.max())}")
        if self.drop_last:  # the sampler's last N % batch_size indices, as BatchSampler drops them: a random
            indices = indices[: len(indices) - len(indices) % self.batch_size]  # few, not the shortest
        full, leftover = [], []
        for bucket in indices.split(self.bucket_size):
            bucket = self._longest_first(bucket)
            cut = len(bucket) - len(bucket) % self.batch_size
            full.extend(bucket[:cut].split(self.batch_size) if cut else ())
            leftover.append(bucket[cut:])
        rest = torch.cat(leftover) if leftover else torch.empty(0, dtype=torch.long)
        tail = [b for b in self._longest_first(rest).split(self.batch_size) if len(b)]
        batches = full + tail
        if self.shuffle:
            batches = [batches[i] for i in torch.randperm(len(batches), generator=self.generator).tolist()]
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self._batches():
            yield batch.tolist()

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)


def reorders_rows(loader) -> bool:
    """Whether a DataLoader draws its items in random order (a RandomSampler, or the
    DistributedSampler(shuffle=True) Lightning puts in a shuffling loader under DDP) or
    regroups them by length (a LengthBucketBatchSampler), so that row i of one batch does
    not continue row i of the last."""
    def random(sampler) -> bool:
        return isinstance(sampler, RandomSampler) or (isinstance(sampler, DistributedSampler) and sampler.shuffle)

    batch_sampler = getattr(loader, "batch_sampler", None)
    return (random(getattr(loader, "sampler", None)) or isinstance(batch_sampler, LengthBucketBatchSampler)
            or random(getattr(batch_sampler, "sampler", None)))
