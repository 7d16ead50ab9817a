"""Which dtypes a recurrent kernel computes in, with or without autocast.

Without autocast everything runs in the weights' dtype. Under ``torch.autocast`` the
GEMM operands (input, weights, hidden state fed to the recurrent GEMM) are cast to the
autocast dtype (bf16/fp16), while the gate pre-activations, the cell state and every
accumulation stay in the weights' dtype (fp32). The activated gates saved for the
backward pass are stored in the low precision, and the layer output follows autocast's
convention for matmuls (low precision). The final states are what the next step would
read: the LSTM's h_n in the low precision (a GEMM operand only) and its c_n in fp32; the
GRU's h_n, which its next step also reads in the pointwise update, in fp32. So a state
carried on (a checkpointed chunk's boundary, truncated BPTT, stateful training) continues
exactly as one long sequence would.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from functools import cache

import torch


@dataclass(frozen=True)
class Precision:
    compute: torch.dtype  # GEMM operands, saved gates, outputs
    state: torch.dtype  # pre-activations, cell/hidden state, accumulations

    @property
    def mixed(self) -> bool:
        return self.compute != self.state

    @classmethod
    def for_call(cls, x: torch.Tensor, weight: torch.Tensor) -> "Precision":
        device_type = x.device.type
        if torch.is_autocast_enabled(device_type) and weight.dtype == torch.float32:
            return _precision(torch.get_autocast_dtype(device_type), weight.dtype)
        return _precision(weight.dtype, weight.dtype)


@cache
def _precision(compute: torch.dtype, state: torch.dtype) -> Precision:
    """One (immutable) Precision per pair of dtypes: kernels ask for it on every call."""
    return Precision(compute, state)


def autocast_off(device: torch.device):
    """Context in which the kernel casts by hand: autocast must not re-cast our GEMMs. A
    no-op where autocast is off already (entering torch.autocast costs about as much as a
    one-step call's pointwise work)."""
    if not torch.is_autocast_enabled(device.type):
        return contextlib.nullcontext()
    return torch.autocast(device.type, enabled=False)


def cat(tensors, dim: int = 0) -> torch.Tensor:
    """``torch.cat`` outside autocast. A join casts nothing, but CPU autocast refuses to join
    fp16 tensors under bf16 autocast, or bf16 under fp16 ("Unexpected floating ScalarType in
    at::autocast::prioritize"): a ``.half()`` layer inside ``torch.autocast("cpu")`` failed
    where torch.nn's runs."""
    with autocast_off(tensors[0].device):
        return torch.cat(tensors, dim)


def stack(tensors, dim: int = 0) -> torch.Tensor:
    """``torch.stack`` outside autocast (see :func:`cat`)."""
    with autocast_off(tensors[0].device):
        return torch.stack(tensors, dim)


def compute_input(x: torch.Tensor, weight: torch.Tensor, precision: Precision | None = None) -> torch.Tensor:
    """x in the dtype a kernel computes in, contiguous: the kernel then saves its own input.

    The cast runs outside the kernel's autograd.Function, recorded by autograd, so what
    the Function saves for backward is connected to the graph; a backward with
    create_graph=True differentiates through it (see :mod:`.differentiable`).
    """
    precision = precision or Precision.for_call(x, weight)  # the caller's, where it has it
    if x.dtype == precision.compute and x.is_contiguous():
        return x  # what the conversion returns, without its cost per call
    return x.to(precision.compute).contiguous()
