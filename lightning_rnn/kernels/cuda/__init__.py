"""The compiled CUDA backend: one direction of one LSTM/GRU layer, cuBLAS + fused kernels.

Same structure as the CPU backend (the shared driver in ``kernels/csrc/rnn_driver.h``):
per step one cuBLAS GEMM (through ATen, on the current stream) and one fused pointwise
kernel, forward and backward. Built just in time from ``rnn_cuda.cpp`` and
``rnn_cuda_kernels.cu`` where a GPU, a CUDA build of torch and nvcc exist; anywhere
else :func:`load` raises BackendUnavailable, so a CPU-only install never breaks.
Signatures and semantics are those of :mod:`lightning_rnn.kernels.reference`.
"""
from __future__ import annotations

from types import ModuleType

import torch

from ..cpp.build import jit_build
from ..cpp.functions import make_functions
from ..dispatch import BackendUnavailable

SOURCES = ["rnn_cuda.cpp", "rnn_cuda_kernels.cu"]
CFLAGS = ["-O3", "-std=c++20"]
CUDA_CFLAGS = ["-O3", "-std=c++20"]


def _why_unavailable() -> str | None:
    if torch.version.cuda is None:
        return "this torch build has no CUDA support"
    if not torch.cuda.is_available():
        return "no CUDA device is visible"
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME is None:
        return "nvcc / CUDA_HOME not found"
    return None


def load() -> ModuleType:
    """The built extension; builds it on first use. Raises BackendUnavailable."""
    reason = _why_unavailable()
    if reason is not None:
        raise BackendUnavailable(f"the 'cuda' backend needs a GPU and nvcc: {reason}")
    return jit_build("cuda", SOURCES, CFLAGS, CUDA_CFLAGS)


LSTMFunction, GRUFunction, lstm, gru = make_functions(load)

__all__ = ["load", "lstm", "gru", "LSTMFunction", "GRUFunction"]
