"""What a kernel backend declares: where it runs, what it computes natively, its entry points.

A kernel backend runs the recurrence of the fused layers. Each one is a :class:`Backend`
object (``BACKEND`` in its module: :mod:`.reference`, :mod:`.cpp`, :mod:`.cuda`) that
states its capabilities and holds its entry points; :mod:`.run` asks it, never probes it.

Entry points (shapes in :mod:`.reference`; ``weights`` per layer-direction as
``(w_ih, w_hh, b_ih, b_hh, w_hr)``, None where the layer has no such weight):

- ``lstm(x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, reverse, w_hr=None) -> (out, h_n, c_n)``
  and ``gru(x, batch_sizes, h0, w_ih, w_hh, b_ih, b_hh, reverse) -> (out, h_n)``: one direction of
  one layer. Every backend has them.
- ``stack(cell, x, batch_sizes, states, weights, num_layers, num_directions) -> (out, finals) | None``:
  a whole stack without inter-layer dropout in one call, or None where this call needs the
  per-layer path (a precision the backend lacks, weights of several dtypes).
- ``padded(cell, x, h0, c0, weights, num_layers, num_directions) -> (out, finals) | None``: the
  common call, a padded time-major ``(T, B, I)`` batch from zero (None) or given states, in one
  step; only called for a dtype in ``padded_dtypes`` outside autocast.
- ``weight_packs() -> store``: a context that keeps weights packed across the separate kernel
  calls of gradient checkpointing's chunks (see :mod:`.checkpointing`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


class BackendUnavailable(RuntimeError):
    """A compiled backend cannot be used here (no compiler, no GPU, build error)."""


@dataclass(frozen=True)
class Backend:
    name: str
    devices: tuple[str, ...] | None  # device types it runs on; None: any (torch ops only)
    load: Callable[[], object]  # builds or imports what the entry points need; raises BackendUnavailable
    lstm: Callable[..., tuple]
    gru: Callable[..., tuple]
    stack: Callable[..., tuple | None] | None = None
    padded: Callable[..., tuple | None] | None = None
    padded_dtypes: tuple[torch.dtype, ...] = ()
    weight_packs: Callable[[], object] | None = None
    # whether lstm/gru take ``extras`` (cell.CellExtras: layer norm, zoneout, recurrent dropout)
    cell_options: bool = False
    # (LSTM, GRU) autograd.Functions that record one layer-direction where the entry points
    # do it in Python (reference: always; compiled: gradient checkpointing, forward-mode AD)
    functions: tuple[type, type] | None = None

    def cell(self, name: str) -> Callable[..., tuple]:
        """The one-layer-direction entry point of cell ``name`` ("lstm" or "gru")."""
        return self.lstm if name == "lstm" else self.gru

    def function(self, name: str) -> type:
        """The autograd.Function of cell ``name`` (gradcheck and tests call it directly)."""
        return self.functions[0 if name == "lstm" else 1]

    def runs_on(self, device_type: str) -> bool:
        return self.devices is None or device_type in self.devices
