"""The compiled CPU backend: one direction of one LSTM/GRU layer in C++.

Built just in time from ``kernels/csrc/rnn_cpu.cpp`` on first use (one line on stderr
says so) and cached on disk; see :mod:`.build`. Signatures and semantics are those of
:mod:`lightning_rnn.kernels.reference`::

    lstm(x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, reverse) -> (out, h_n, c_n)
    gru(x, batch_sizes, h0, w_ih, w_hh, b_ih, b_hh, reverse)      -> (out, h_n)
"""
from __future__ import annotations

from types import ModuleType

from .build import jit_build
from .functions import make_functions

SOURCES = ["rnn_cpu.cpp"]
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-std=c++20"]


def load() -> ModuleType:
    """The built extension; builds it on first use. Raises BackendUnavailable."""
    return jit_build("cpp", SOURCES, CFLAGS)


def weight_packs():
    """A store that keeps the weights packed for oneDNN while active (``with store:``).

    Kernel calls made inside it pack each weight (same tensor, same version) once;
    ``store.clear()`` drops the copies. Used by gradient checkpointing, whose chunks are
    separate kernel calls over the same weights (layers/checkpointing.py).
    """
    return load().WeightPacks()


LSTMFunction, GRUFunction, lstm, gru = make_functions(load)

__all__ = ["load", "lstm", "gru", "LSTMFunction", "GRUFunction", "weight_packs"]
