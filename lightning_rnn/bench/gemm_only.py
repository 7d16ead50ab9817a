"""The lower bound: exactly the GEMMs one fwd+bwd of a recurrent stack needs, nothing else.

Per layer (G gates: 4 for LSTM, 3 for GRU; N = real tokens; b_t = rows of step t;
I = the layer's input size; H = hidden size)::

    forward   input projection   (N, I)    @ (I, G*H)     once
              recurrent          (b_t, H)  @ (H, G*H)     every step t
    backward  recurrent dh       (b_t, G*H) @ (G*H, H)    every step t
              dX                 (N, G*H)  @ (G*H, I)     once
              dW_ih              (G*H, N)  @ (N, I)       once
              dW_hh              (G*H, N)  @ (N, H)       once

so a layer costs 6 * N * G*H * (I + H) floating-point operations. The operands are
preallocated (per layer; each step writes its own rows, as a real layer does) and the
transposed operands are views, as in the kernels. Timing :meth:`GemmOnly.run` next to a
layer gives the fraction of the layer's time that is not GEMM.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

NUM_GATES = {"lstm": 4, "gru": 3}


@dataclass(frozen=True)
class Gemm:
    """One matrix product ``(m, k) @ (k, n)``."""

    name: str
    m: int
    k: int
    n: int

    @property
    def flops(self) -> int:
        """Floating-point operations: one multiply and one add per (m, k, n) triple."""
        return 2 * self.m * self.k * self.n


def gemm_flops_formula(cell: str, input_size: int, hidden_size: int, num_layers: int, tokens: int) -> int:
    """Closed form of the FLOPs of one fwd+bwd: sum over layers of 6 * N * G*H * (I + H)."""
    GH = NUM_GATES[cell] * hidden_size
    return sum(
        6 * tokens * GH * ((input_size if layer == 0 else hidden_size) + hidden_size) for layer in range(num_layers)
    )


def _op(name: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> tuple:
    """(Gemm, a, b, out) with the Gemm's shape read off the operands."""
    (m, k), (k2, n) = a.shape, b.shape
    if k2 != k or tuple(out.shape) != (m, n):
        raise AssertionError(f"{name}: operand shapes {tuple(a.shape)} @ {tuple(b.shape)} -> {tuple(out.shape)}")
    return Gemm(name, m, k, n), a, b, out


class GemmOnly:
    """Preallocated operands and the list of GEMMs of one fwd+bwd; :meth:`run` does them all.

    batch_sizes: rows of each time step (non-increasing), as in a PackedSequence;
    ``[B] * T`` for a full batch.
    """

    def __init__(
        self,
        cell: str,
        input_size: int,
        hidden_size: int,
        num_layers: int,
        batch_sizes: Sequence[int],
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ):
        if cell not in NUM_GATES:
            raise ValueError(f"cell: expected one of {', '.join(NUM_GATES)}, got {cell!r}")
        self.cell = cell
        batch_sizes = [int(b) for b in batch_sizes]
        N, H, GH = sum(batch_sizes), hidden_size, NUM_GATES[cell] * hidden_size
        offsets = [sum(batch_sizes[:t]) for t in range(len(batch_sizes))]
        new = lambda *shape: torch.randn(*shape, device=device, dtype=dtype)  # noqa: E731
        forward, backward = [], []  # (Gemm, a, b, out)
        for layer in range(num_layers):
            I = input_size if layer == 0 else H
            x, w_ih, w_hh = new(N, I), new(GH, I), new(GH, H)  # weights in torch.nn's (G*H, ·) layout
            gates, h, dG, dh = new(N, GH), new(N, H), new(N, GH), new(N, H)
            dx, dw_ih, dw_hh = new(N, I), new(GH, I), new(GH, H)
            p = f"layer{layer}"
            forward.append(_op(f"{p} x@W_ih^T", x, w_ih.t(), gates))
            for t, (o, b) in enumerate(zip(offsets, batch_sizes)):
                forward.append(_op(f"{p} t{t} h@W_hh^T", h[o : o + b], w_hh.t(), gates[o : o + b]))
            layer_backward = []
            for t, (o, b) in reversed(list(enumerate(zip(offsets, batch_sizes)))):
                layer_backward.append(_op(f"{p} t{t} dG@W_hh", dG[o : o + b], w_hh, dh[o : o + b]))
            layer_backward += [
                _op(f"{p} dX", dG, w_ih, dx),
                _op(f"{p} dW_ih", dG.t(), x, dw_ih),
                _op(f"{p} dW_hh", dG.t(), h, dw_hh),
            ]
            backward = layer_backward + backward  # the last layer's backward runs first
        self._ops = forward + backward

    @property
    def gemms(self) -> list[Gemm]:
        """The GEMMs :meth:`run` performs, in order."""
        return [g for g, *_ in self._ops]

    @property
    def flops(self) -> int:
        """Floating-point operations of one :meth:`run`."""
        return sum(g.flops for g in self.gemms)

    def run(self) -> None:
        """One fwd+bwd worth of GEMMs on the preallocated operands."""
        for _, a, b, out in self._ops:
            torch.mm(a, b, out=out)
