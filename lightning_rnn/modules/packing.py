"""Per-step targets aligned with packed per-step predictions."""
from __future__ import annotations

import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence


def pack_like(padded: torch.Tensor, like: PackedSequence) -> PackedSequence:
    """``padded`` (B, T, ...) batch-first, packed with the lengths and order of ``like``.

    For a per-step model fed packed inputs (a batch with ``lengths``, or the
    ``PackedSequences`` callback) the head's predictions are a PackedSequence, while the
    batch's targets are padded (B, T, ...): ``pack_like(targets, predictions).data`` holds
    the real steps' targets row for row with ``predictions.data``, so a loss or a metric
    sees no padding::

        F.cross_entropy(predictions.data, pack_like(batch["targets"], predictions).data)
    """
    if not isinstance(like, PackedSequence):
        raise TypeError(f"like: expected a PackedSequence, got {type(like).__name__}")
    batch_sizes = like.batch_sizes
    B = int(batch_sizes[0]) if len(batch_sizes) else 0
    if not isinstance(padded, torch.Tensor) or padded.dim() < 2 or padded.shape[0] != B \
            or padded.shape[1] < len(batch_sizes):
        described = f"shape {tuple(padded.shape)}" if isinstance(padded, torch.Tensor) else type(padded).__name__
        raise ValueError(f"padded: expected a batch-first tensor of {B} sequences of at least {len(batch_sizes)} "
                         f"steps (B, T, ...) to pack like the predictions, got {described}")
    # The sorted sequences' lengths: sequence j (in like's order) runs while batch_sizes > j.
    lengths = (batch_sizes.unsqueeze(0) > torch.arange(B, device=batch_sizes.device).unsqueeze(1)).sum(dim=1)
    if like.sorted_indices is not None:
        padded = padded.index_select(0, like.sorted_indices.to(padded.device))
    packed = pack_padded_sequence(padded, lengths, batch_first=True, enforce_sorted=True)
    return packed._replace(sorted_indices=like.sorted_indices, unsorted_indices=like.unsorted_indices)
