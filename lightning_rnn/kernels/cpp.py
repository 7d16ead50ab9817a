"""The compiled CPU backend: the recurrence of the fused layers in C++.

Built just in time from ``kernels/csrc/rnn_cpu.cpp`` on first use (one line on stderr
says so) and cached on disk; see :mod:`.extension.build`. Its entry points and their
semantics are the reference backend's (:mod:`.backends`, :mod:`.reference`); the autograd
glue is shared with the CUDA backend (:mod:`.extension.autograd`).
"""
from __future__ import annotations

import os
from types import ModuleType

from .extension.autograd import make_backend
from .extension.build import jit_build

SOURCES = ["rnn_cpu.cpp"]
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-std=c++20"]

POOL_ENV = "LIGHTNING_RNN_POOL_MB"
_pool_env_checked = False
_loaded: ModuleType | None = None  # the extension, once loaded in this process


def load() -> ModuleType:
    """The built extension; builds it on first use. Raises BackendUnavailable, or a
    ValueError for a ``LIGHTNING_RNN_POOL_MB`` that is not a whole number of MiB."""
    global _loaded
    if not _pool_env_checked:
        check_pool_env()
    _loaded = jit_build("cpp", SOURCES, CFLAGS)
    return _loaded


def pool_idle_bytes() -> int:
    """Bytes of kernel buffers the pool keeps mapped for the next call (csrc/rnn_pool.h): at
    most its capacity (``LIGHTNING_RNN_POOL_MB``, 256 MiB by default), and part of the process's
    resident memory. 0 where the kernels have not run in this process (nothing is built here)."""
    return 0 if _loaded is None else int(_loaded.pool_idle_bytes())


def release_pool() -> int:
    """Free the pool's idle buffers now (its capacity stays: later calls fill it again);
    returns the bytes freed. ``load().set_pool_capacity(bytes)`` changes the capacity."""
    if _loaded is None:
        return 0
    freed, capacity = _loaded.pool_idle_bytes(), _loaded.pool_capacity()
    _loaded.set_pool_capacity(0)
    _loaded.set_pool_capacity(capacity)
    return int(freed)


def check_pool_env() -> None:
    """A ValueError naming ``LIGHTNING_RNN_POOL_MB`` unless it is unset, empty or a whole
    number of MiB >= 0 (the kernels' buffer pool, csrc/rnn_pool.h, reads it with atoll,
    which would take "0.5" or "abc" for 0 and a huge value for a negative capacity)."""
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
    separate kernel calls over the same weights (:mod:`.checkpointing`).
    """
    return load().WeightPacks()


BACKEND = make_backend("cpp", ("cpu",), load, weight_packs)
lstm, gru, stack, padded = BACKEND.lstm, BACKEND.gru, BACKEND.stack, BACKEND.padded
LSTMFunction, GRUFunction = BACKEND.functions

__all__ = ["BACKEND", "load", "lstm", "gru", "stack", "padded", "LSTMFunction", "GRUFunction", "weight_packs",
           "pool_idle_bytes", "release_pool"]
