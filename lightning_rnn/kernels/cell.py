"""What the kernels need to know of a cell type: its gates, its states, its options."""
from __future__ import annotations

from dataclasses import dataclass

import torch


#: Layer normalization's epsilon (torch.nn.LayerNorm's default), for every backend.
NORM_EPS = 1e-5


@dataclass(frozen=True)
class CellSpec:
    name: str  # "lstm" or "gru": the backends' entry point, and torch's op (torch._VF.<name>)
    num_gates: int  # G: weight_ih is (G*H, I)
    num_states: int  # 2 for (h, c), 1 for h
    projects: bool = False  # accepts proj_size > 0 (torch.nn: LSTM only)


LSTM = CellSpec(name="lstm", num_gates=4, num_states=2, projects=True)
GRU = CellSpec(name="gru", num_gates=3, num_states=1)


@dataclass(frozen=True)
class CellExtras:
    """What one layer-direction's kernel call needs beyond torch.nn's cell: the cell options'
    parameters and this call's masks (drawn by :mod:`.masks`; None where an option is off or
    in evaluation mode, where zoneout uses its expectation). Weight drop is applied by the
    kernels to W_hh (``w_hh * weight_keep / (1 - weight_p)``), so that only its bool mask is
    saved, not a dropped copy of the weight; the gradient goes to the raw W_hh."""

    norm: tuple = ()  # layer norm: (ih_weight, ih_bias, hh_weight, hh_bias[, c_weight, c_bias]); () off
    recurrent_keep: torch.Tensor | None = None  # (B, P) bool: recurrent dropout's keep mask
    recurrent_p: float = 0.0
    zoneout: tuple[float, float] = (0.0, 0.0)  # (cell, hidden) probabilities; the GRU's is the hidden one
    keep_c: torch.Tensor | None = None  # (N, H) bool: zoneout keeps c_{t-1} (LSTM, training)
    keep_h: torch.Tensor | None = None  # (N, P) bool: zoneout keeps h_{t-1} (training)
    weight_keep: torch.Tensor | None = None  # (G*H, P) bool: weight drop keeps these entries of W_hh
    weight_p: float = 0.0

    def lstm_inputs(self) -> tuple:
        """The reference LSTMFunction's inputs after ``w_hr``, in its order."""
        norm = self.norm or (None,) * 6
        return (*norm, self.recurrent_keep, self.recurrent_p, *self.zoneout, self.keep_c, self.keep_h,
                self.weight_keep, self.weight_p)

    def gru_inputs(self) -> tuple:
        """The reference GRUFunction's inputs after ``reverse``, in its order."""
        norm = self.norm or (None,) * 4
        return (*norm, self.recurrent_keep, self.recurrent_p, self.zoneout[1], self.keep_h, self.weight_keep,
                self.weight_p)

    # ---- gradient checkpointing: the tensors by how a chunk of steps takes them ----------
    def row_tensors(self) -> list[torch.Tensor]:
        """(N, ·) tensors a chunk takes its rows of: the zoneout masks."""
        return [t for t in (self.keep_c, self.keep_h) if t is not None]

    def sequence_tensors(self) -> list[torch.Tensor]:
        """(B, ·) tensors a chunk takes its sequences of: recurrent dropout's mask."""
        return [] if self.recurrent_keep is None else [self.recurrent_keep]

    def whole_tensors(self) -> list[torch.Tensor]:
        """Tensors every chunk takes whole: the norm parameters and weight drop's mask."""
        return [*self.norm, *([] if self.weight_keep is None else [self.weight_keep])]

    def with_tensors(self, rows: list, sequences: list, whole: list) -> "CellExtras":
        """These extras with the tensors of :meth:`row_tensors`, :meth:`sequence_tensors` and
        :meth:`whole_tensors` replaced by a chunk's."""
        rows = iter(rows)
        keep_c = None if self.keep_c is None else next(rows)
        keep_h = None if self.keep_h is None else next(rows)
        recurrent_keep = None if self.recurrent_keep is None else sequences[0]
        norm = tuple(whole[: len(self.norm)])
        weight_keep = None if self.weight_keep is None else whole[len(self.norm)]
        return CellExtras(norm, recurrent_keep, self.recurrent_p, self.zoneout, keep_c, keep_h, weight_keep,
                          self.weight_p)
