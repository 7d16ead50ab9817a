"""The compiled CUDA backend: the recurrence of the fused layers, cuBLAS + fused kernels.

Same structure as the CPU backend (the shared driver in ``kernels/csrc/rnn_driver.h``):
per step one cuBLAS GEMM (through ATen, on the current stream) and one fused pointwise
kernel, forward and backward. Built just in time from ``rnn_cuda.cpp`` and
``rnn_cuda_kernels.cu`` where a GPU, a CUDA build of torch and nvcc exist; anywhere
else :func:`load` raises BackendUnavailable, so a CPU-only install never breaks.
Signatures and semantics are those of :mod:`lightning_rnn.kernels.reference`.
"""
from __future__ import annotations

import glob
import os
import shutil
from types import ModuleType

import torch

from .backends import BackendUnavailable
from .extension.autograd import make_backend
from .extension.build import jit_build

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
    if not _has_cuda_headers(CUDA_HOME):
        # torch takes the folder above nvcc's bin/ as CUDA_HOME: /usr/local for a symlink
        # /usr/local/bin/nvcc, which has no CUDA headers; the toolkit is where the link points
        nvcc = shutil.which("nvcc")
        real = os.path.realpath(nvcc) if nvcc else None
        toolkit = os.path.dirname(os.path.dirname(real)) if real else None
        hint = f" (nvcc is {real}: try CUDA_HOME={toolkit})" if toolkit and toolkit != CUDA_HOME else ""
        return (f"CUDA_HOME={CUDA_HOME} has no include/cuda_runtime.h; set CUDA_HOME to the CUDA toolkit's "
                f"folder{hint}")
    return None


def _has_cuda_headers(cuda_home: str) -> bool:
    """cuda_runtime.h where torch's build looks: CUDA_HOME/include, $CUDA_INC_PATH, or a
    conda-style CUDA_HOME/targets/<platform>/include."""
    folders = [os.path.join(cuda_home, "include"), os.environ.get("CUDA_INC_PATH", "")]
    folders += glob.glob(os.path.join(cuda_home, "targets", "*", "include"))
    return any(folder and os.path.exists(os.path.join(folder, "cuda_runtime.h")) for folder in folders)


def load() -> ModuleType:
    """The built extension; builds it on first use. Raises BackendUnavailable."""
    reason = _why_unavailable()
    if reason is not None:
        raise BackendUnavailable(f"the 'cuda' backend needs a GPU and nvcc: {reason}")
    return jit_build("cuda", SOURCES, CFLAGS, CUDA_CFLAGS)


BACKEND = make_backend("cuda", ("cuda",), load)
lstm, gru, stack, padded = BACKEND.lstm, BACKEND.gru, BACKEND.stack, BACKEND.padded
LSTMFunction, GRUFunction = BACKEND.functions

__all__ = ["BACKEND", "load", "lstm", "gru", "stack", "padded", "LSTMFunction", "GRUFunction"]
