"""What the modules read from a batch dict: inputs, lengths, sequence counts, scored steps, time chunks."""
from __future__ import annotations

import torch
from torch.nn.utils.rnn import PackedSequence

from .packing import pack_like


def check_lengths(lengths, padded: torch.Tensor) -> torch.Tensor:
    """``lengths`` (a tensor, list or tuple of B ints in [1, T]) as a CPU int64 tensor, for
    the (B, T, ...) batch ``padded``; a ValueError naming ``lengths`` otherwise."""
    lengths = torch.as_tensor(lengths, device="cpu") if not isinstance(lengths, torch.Tensor) else lengths.cpu()
    if lengths.dim() != 1 or lengths.is_floating_point() or lengths.is_complex():
        raise ValueError(f"lengths: expected B integer lengths, got {lengths.dtype} of shape {tuple(lengths.shape)}")
    B, T = padded.shape[:2]
    if len(lengths) != B:
        raise ValueError(f"lengths: expected one length per sequence ({B}), got {len(lengths)}")
    if len(lengths) and (lengths.min() < 1 or lengths.max() > T):
        raise ValueError(f"lengths: expected lengths in [1, {T}] (the inputs' steps, dim 1), "
                         f"got {lengths.min().item()}..{lengths.max().item()}")
    return lengths.long()


def check_float_steps(inputs, input_size: int) -> None:
    """A ValueError naming ``inputs`` unless they are (B, T, input_size) floats or packed."""
    if isinstance(inputs, PackedSequence):
        return
    if not isinstance(inputs, torch.Tensor) or inputs.dim() != 3 or not inputs.is_floating_point():
        described = f"{inputs.dtype} of shape {tuple(inputs.shape)}" if isinstance(inputs, torch.Tensor) \
            else type(inputs).__name__
        raise ValueError(f"inputs: expected floats of shape (B, T, {input_size}) or a PackedSequence, got {described}")


def real_steps(predictions, targets):
    """``(predictions, targets)`` as a metric takes them: packed per-step predictions as
    their rows (``.data``) and the targets packed alike (padded (B, T, ...) ones by
    :func:`~lightning_rnn.modules.pack_like`), so padding is never scored; others as they are."""
    if not isinstance(predictions, PackedSequence):
        return predictions, targets
    targets = targets if isinstance(targets, PackedSequence) else pack_like(targets, predictions)
    return predictions.data, targets.data


def sequences_in(batch: dict) -> int:
    """Sequences in ``batch``: its ``lengths``' count where given (packed targets have one
    row per real step, not per sequence), else the targets' first dimension."""
    return len(batch["lengths"]) if "lengths" in batch else len(batch["targets"])


def split_along_time(batch: dict, steps: int) -> list[dict]:
    """``batch`` cut into chunks of ``steps`` steps: every tensor with a time dimension
    (dim >= 2) along dim 1, the others repeated in every chunk. All timed tensors must
    have the same length, and the batch no ``lengths``."""
    if "lengths" in batch or isinstance(batch["inputs"], PackedSequence):
        raise ValueError("tbptt_steps: truncated BPTT needs equal-length batches, got variable lengths")
    timed = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor) and v.dim() >= 2}
    lengths = {k: v.shape[1] for k, v in timed.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"tbptt_steps: batch tensors differ in length along time (dim 1): {lengths}; "
                         "override split_batch for this kind of batch")
    pieces = {k: v.split(steps, dim=1) for k, v in timed.items()}
    num_chunks = len(next(iter(pieces.values())))
    return [{**batch, **{k: p[i] for k, p in pieces.items()}} for i in range(num_chunks)]
