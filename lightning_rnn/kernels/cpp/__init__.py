"""The compiled CPU backend: one direction of one LSTM/GRU layer in C++.

Built just in time from ``kernels/csrc/rnn_cpu.cpp`` on first use (one line on stderr
says so) and cached on disk; see :mod:`.build`. Signatures and semantics are those of
:mod:`lightning_rnn.kernels.reference`::

    lstm(x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, reverse) -> (out, h_n, c_n)
    gru(x, batch_sizes, h0, w_ih, w_hh, b_ih, b_hh, reverse)      -> (out, h_n)
"""
from __future__ import annotations

import os
from types import ModuleType

from .build import jit_build
from .functions import make_functions

SOURCES = ["rnn_cpu.cpp"]
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-std=c++20"]


POOL_ENV = "LIGHTNING_RNN_POOL_MB"
_pool_env_checked = False


def load() -> ModuleType:
    """The built extension; builds it on first use. Raises BackendUnavailable, or a
    ValueError for a ``LIGHTNING_RNN_POOL_MB`` that is not a whole number of MiB."""
    if not _pool_env_checked:
        check_pool_env()
    return jit_build("cpp", SOURCES, CFLAGS)


def check_pool_env() -> None:
    """A ValueError naming ``LIGHTNING_RNN_POOL_MB`` unless it is unset, empty or a whole
    number of MiB >= 0: the kernels' buffer pool (csrc/rnn_pool.h) reads it with atoll when
    it first serves a call, which took "0.5", "abc" or " " for 0 (no pool), "1.5" for 1 MiB
    and 99999999999999 (shifted to bytes past int64) for a negative capacity."""
    global _pool_env_checked
    value = os.environ.get(POOL_ENV, "")
    digits = value.strip()
    if value and not (digits.isascii() and digits.isdigit() and int(digits) < 2**43):  # MiB << 20 fits an int64
        raise ValueError(
            f"{POOL_ENV}: expected a whole number of MiB >= 0 (the most idle kernel buffers kept; 0 turns "
            f"the pool off), got {value!r}"
        )
    _pool_env_checked = True


def weight_packs():
    """A store that keeps the weights packed for oneDNN while active (``with store:``).

    Kernel calls made inside it pack each weight (same tensor, same version) once;
    ``store.clear()`` drops the copies. Used by gradient checkpointing, whose chunks are
    separate kernel calls over the same weights (layers/checkpointing.py).
    """
    return load().WeightPacks()


LSTMFunction, GRUFunction, lstm, gru, stack, padded = make_functions(load)

__all__ = ["load", "lstm", "gru", "stack", "padded", "LSTMFunction", "GRUFunction", "weight_packs"]
