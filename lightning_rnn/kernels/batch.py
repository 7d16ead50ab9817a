"""One description of a batch for the kernels, from any input torch.nn.LSTM/GRU accept.

torch.nn recurrent layers take a padded tensor ``(T, B, I)`` (``(B, T, I)`` with
``batch_first``), an unbatched ``(T, I)`` tensor, or a PackedSequence. The kernels take
one layout: packed, time-major rows ``(N, I)`` plus ``batch_sizes``. A full batch is
the packed layout with ``batch_sizes = [B] * T`` (a view, no copy, when time-major);
torch.nn's path and the backends' padded entry take it as the ``(T, B, I)`` tensor itself.
:meth:`SequenceBatch.restore` and :meth:`SequenceBatch.restore_state` give the results
back in the caller's layout and batch order.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.nn.utils.rnn import PackedSequence


class InputMismatchError(ValueError, TypeError, RuntimeError):
    """An input or initial state whose shape, dtype or device does not fit the layer.

    A ValueError naming the argument, like every other bad input here (a TypeError for a
    wrong dtype), and also each exception torch.nn.LSTM/GRU raise in these cases (a
    RuntimeError for most, a ValueError for others), so code written against torch.nn
    (``except RuntimeError``) catches it too.
    """


@dataclass
class SequenceBatch:
    source: torch.Tensor  # packed: the (N, I) rows; full batches: the (T, B, I) time-major tensor
    packed_batch_sizes: torch.Tensor | None  # packed input only: its (T,) batch sizes
    sorted_indices: torch.Tensor | None  # packed input only: batch row -> sorted position
    unsorted_indices: torch.Tensor | None
    kind: str  # "packed", "padded" or "unbatched"
    # B, the number of sequences, and T, the number of steps: a full batch's from its shape
    # (no data-dependent read while a graph is captured for export), a packed one's from
    # the batch sizes its check read (no tensor reads per call).
    batch: int
    num_steps: int
    batch_first: bool = False
    _data: torch.Tensor | None = field(default=None, repr=False)
    _batch_sizes: torch.Tensor | None = field(default=None, repr=False)

    @classmethod
    def from_input(cls, input, batch_first: bool, input_size: int) -> "SequenceBatch":
        if isinstance(input, PackedSequence):
            if input.data.dim() != 2:  # pack_padded_sequence makes (N, input_size) rows
                raise InputMismatchError(
                    f"input.data: expected a 2-D (N, input_size) tensor of packed rows, got shape {tuple(input.data.shape)}"
                )
            _check_features(input.data, input_size, "input.data")
            sizes = _check_packed(input)
            return cls(
                input.data, input.batch_sizes, input.sorted_indices, input.unsorted_indices, "packed",
                sizes[0], len(sizes),
            )
        if not isinstance(input, torch.Tensor):
            raise TypeError(f"input: expected a Tensor or PackedSequence, got {type(input).__name__}")
        if input.dim() not in (2, 3):
            raise InputMismatchError(
                f"input: expected a 3-D batched tensor ({'B, T' if batch_first else 'T, B'}, input_size) "
                f"or a 2-D unbatched tensor (T, input_size), got shape {tuple(input.shape)}"
            )
        _check_features(input, input_size, "input")
        kind = "padded" if input.dim() == 3 else "unbatched"
        x = input if kind == "padded" else input.unsqueeze(1)
        if kind == "padded" and batch_first:
            x = x.transpose(0, 1)
        T, B = x.shape[0], x.shape[1]
        if T == 0:
            raise InputMismatchError(f"input: expected at least one time step, got shape {tuple(input.shape)}")
        return cls(x, None, None, None, kind, B, T, batch_first and kind == "padded")

    @property
    def batch_sizes(self) -> torch.Tensor:
        """(T,) int64 on the host (not the default device), non-increasing: rows per step.
        A full batch's are made on first use (the padded entry needs none)."""
        if self.packed_batch_sizes is not None:
            return self.packed_batch_sizes
        if self._batch_sizes is None:
            self._batch_sizes = torch.full((self.num_steps,), self.batch, dtype=torch.int64, device="cpu")
        return self._batch_sizes

    @property
    def device(self) -> torch.device:
        return self.source.device

    @property
    def data(self) -> torch.Tensor:
        """(N, I) packed time-major rows, the kernels' layout (a view of a contiguous full
        batch; made on first use, once: a batch_first one is copied)."""
        if self._data is None:
            self._data = self.source if self.kind == "packed" else self.source.reshape(-1, self.source.shape[-1])
        return self._data

    @property
    def is_full(self) -> bool:
        """True when every sequence has every time step (no packing needed)."""
        return self.kind != "packed"

    @property
    def unbatched(self) -> bool:
        return self.kind == "unbatched"

    def restore(self, out: torch.Tensor):
        """Packed ``(N, F)`` output (a full batch's also as ``(T, B, F)``) -> the caller's layout."""
        if self.kind == "packed":
            return PackedSequence(out, self.batch_sizes, self.sorted_indices, self.unsorted_indices)
        y = out if out.dim() == 3 else out.view(self.num_steps, self.batch, out.shape[-1])  # (T, B, F)
        if self.kind == "unbatched":
            return y.squeeze(1)
        return y.transpose(0, 1) if self.batch_first else y

    def sort_state(self, state: torch.Tensor) -> torch.Tensor:
        """(L*D, B, H) in the caller's batch order (an unbatched input's (L*D, H) too) -> the
        kernels' layout and length-sorted order."""
        if self.unbatched:
            return state.unsqueeze(1)
        return state if self.sorted_indices is None else state.index_select(1, self.sorted_indices)

    def restore_state(self, state: torch.Tensor) -> torch.Tensor:
        """(L*D, B, H) in sorted order -> the caller's order (and layout, if unbatched)."""
        if self.unsorted_indices is not None:
            state = state.index_select(1, self.unsorted_indices)
        return state.squeeze(1) if self.unbatched else state


def _check_packed(input: PackedSequence) -> list[int]:
    """``input.batch_sizes`` as a list, checked: a PackedSequence as pack_padded_sequence and
    pack_sequence make it, batch_sizes a non-empty 1-D int64 CPU tensor of positive,
    non-increasing sizes summing to the rows of data, and sorted_indices (if any) one per
    sequence. Checked here, for every backend, so that a hand-built one is named, not met
    deep in a kernel (or run as another batch)."""
    bs = input.batch_sizes
    if bs.dim() != 1 or bs.numel() == 0 or bs.dtype != torch.int64 or bs.device.type != "cpu":
        raise InputMismatchError(
            f"input.batch_sizes: expected a non-empty 1-D int64 CPU tensor, got {bs.dtype} of shape "
            f"{tuple(bs.shape)} on {bs.device}"
        )
    sizes = bs.tolist()
    if sizes[-1] < 1 or any(later > earlier for earlier, later in zip(sizes, sizes[1:])):
        raise InputMismatchError(f"input.batch_sizes: expected positive, non-increasing sizes, got {sizes}")
    if input.data.shape[0] != sum(sizes):
        raise InputMismatchError(
            f"input.data: expected {sum(sizes)} rows (the sum of input.batch_sizes), got {input.data.shape[0]}"
        )
    if input.sorted_indices is not None and tuple(input.sorted_indices.shape) != (sizes[0],):
        raise InputMismatchError(
            f"input.sorted_indices: expected one index per sequence, shape ({sizes[0]},), "
            f"got shape {tuple(input.sorted_indices.shape)}"
        )
    return sizes


def _check_features(x: torch.Tensor, input_size: int, name: str) -> None:
    if not x.is_floating_point():
        raise InputMismatchError(f"{name}: expected a floating-point tensor, got dtype {x.dtype}")
    if x.shape[-1] != input_size:
        raise InputMismatchError(f"{name}: expected last dimension input_size={input_size}, got {x.shape[-1]} (shape {tuple(x.shape)})")
