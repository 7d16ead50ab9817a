"""Reference backend: one direction of one LSTM/GRU layer in plain torch ops.

This is the executable specification every compiled backend is tested against, cell
options included. Each cell is a ``torch.autograd.Function`` (:mod:`.lstm`, :mod:`.gru`)
that

1. projects the input of ALL timesteps with one GEMM: ``(N, I) @ (I, G*H)`` (and, with
   layer norm, normalizes those rows at once),
2. runs the time loop with only ``h @ W_hh^T`` and the gate math per step,
3. saves only the layer input, the activated gates (low precision under autocast), the
   initial states, the masks (bool) and what layer norm needs (see each module);
   ``c_t``/``h_t`` are rebuilt in backward by pointwise scans,
4. runs a hand-written backward time loop, then computes the weight gradients as
   large GEMMs over all N rows at once;
5. under ``create_graph=True`` hands the backward to :mod:`..differentiable` instead, so
   that its gradients can be differentiated again.

Shapes (packed time-major, see :mod:`lightning_rnn.kernels.steps`):
    x        (N, I)     N = sum(batch_sizes) real tokens
    h0, c0   (B, P), (B, H)   B = batch_sizes[0], rows sorted by length (longest first)
    w_ih     (G*H, I)   torch.nn layout and gate order (LSTM: i, f, g, o; GRU: r, z, n)
    w_hh     (G*H, P)
    b_ih, b_hh (G*H,) or None
    out      (N, P)
P = H but for the LSTM's projection (torch.nn.LSTM's ``proj_size``): ``w_hr (P, H)`` maps
``o * tanh(c_t)`` to ``h_t``; ``o * tanh(c_t)`` is rebuilt from the saved gates in backward.
"""
from __future__ import annotations

from ..backends import Backend
from ..cell import CellExtras
from ..precision import compute_input
from .gru import GRUFunction
from .lstm import LSTMFunction


def lstm(x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, reverse, w_hr=None, extras: CellExtras | None = None):
    """``(out, h_n, c_n)`` of one LSTM layer-direction (see the module docstring)."""
    options = () if extras is None else extras.lstm_inputs()
    x = compute_input(x, w_ih)
    return LSTMFunction.apply(x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, reverse, w_hr, *options)


def gru(x, batch_sizes, h0, w_ih, w_hh, b_ih, b_hh, reverse, extras: CellExtras | None = None):
    """``(out, h_n)`` of one GRU layer-direction (see the module docstring)."""
    options = () if extras is None else extras.gru_inputs()
    return GRUFunction.apply(compute_input(x, w_ih), batch_sizes, h0, w_ih, w_hh, b_ih, b_hh, reverse, *options)


def _load():
    return None  # plain torch ops: nothing to build


BACKEND = Backend(
    name="reference", devices=None, load=_load, lstm=lstm, gru=gru, functions=(LSTMFunction, GRUFunction),
    cell_options=True,
)

__all__ = ["BACKEND", "GRUFunction", "LSTMFunction", "gru", "lstm"]
