"""Weight gradients summed in place across the kernel calls of one backward pass.

Gradient checkpointing runs a layer as chunks of a few steps, each a separate kernel call
with its own backward (:mod:`lightning_rnn.kernels.checkpointing`). Left to autograd, every
chunk's backward returns a fresh (out, in) weight gradient per weight, which autograd then
adds to the others: a fresh allocation and an extra pass over the weight per chunk. A
:class:`GradSink` instead keeps one running sum per weight for the pass: while it is
active on a thread (``with sink:``), a compiled backend's backward has its GEMM add into
the sum (:meth:`into`) and hands it back (:meth:`keep`), returning no gradient to autograd
for that weight; the owner returns the sums to autograd once, at the end of the pass.

Only the weights the sink was told about (:meth:`expect`) are summed; any other gradient
passes through untouched, so nothing is summed that the owner will not return.
"""
from __future__ import annotations

import threading

import torch

_active = threading.local()


def _key(w: torch.Tensor) -> tuple:
    """The same weight across detached views: storage address, shape, dtype, device."""
    return (w.data_ptr(), tuple(w.shape), w.dtype, w.device)


class GradSink:
    """Running sums of weight gradients for one backward pass (see the module docstring)."""

    def __init__(self) -> None:
        self._expected: set[tuple] = set()
        self._sums: dict[tuple, torch.Tensor] = {}
        self._owned: set[tuple] = set()  # sums that may be added into in place

    @staticmethod
    def current() -> GradSink | None:
        """The sink active on this thread, or None."""
        stack = getattr(_active, "stack", None)
        return stack[-1] if stack else None

    def __enter__(self) -> GradSink:
        if not hasattr(_active, "stack"):
            _active.stack = []
        _active.stack.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _active.stack.pop()

    def expect(self, weights) -> None:
        """Sum the gradients of these weights (None entries and frozen weights are skipped)."""
        self._expected.update(_key(w) for w in weights if w is not None and w.requires_grad)

    def into(self, w: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
        """The running sum to add w's gradient into in place: one this sink owns, of
        ``dtype`` (the dtype the kernel computes in, which must be w's); else None."""
        key = _key(w)
        total = self._sums.get(key)
        ok = total is not None and key in self._owned and total.dtype == dtype and w.dtype == dtype
        return total if ok else None

    def keep(self, w: torch.Tensor, grad: torch.Tensor | None, owned: bool = False) -> torch.Tensor | None:
        """Add ``grad`` to w's sum (or start it with it) and return None; ``grad`` itself when
        w is not expected (it then goes to autograd as usual). ``owned``: ``grad`` is a fresh
        contiguous tensor nobody else holds (a kernel's result), so later gradients may be
        added into it in place; any other first gradient is copied before the first addition.
        Two weights of one storage (tied) share a sum: a second gradient that is the first one
        again (the LSTM's one bias gradient for b_ih and b_hh) is added, not taken for the sum."""
        if grad is None:
            return None
        key = _key(w)
        if key not in self._expected:
            return grad
        total = self._sums.get(key)
        if total is None:
            self._sums[key] = grad
            if owned:
                self._owned.add(key)
        elif key in self._owned and total.data_ptr() == grad.data_ptr() and total.shape == grad.shape:
            pass  # the kernel added into the sum itself (into() hands out owned sums only)
        elif key in self._owned:
            total.add_(grad)
        else:
            self._sums[key] = total + grad
            self._owned.add(key)
        return None

    def take(self, w: torch.Tensor) -> torch.Tensor | None:
        """w's sum, removed from the sink (None if nothing was added)."""
        key = _key(w)
        self._owned.discard(key)
        return self._sums.pop(key, None)

    def clear(self) -> None:
        """Drop the sums (a new pass starts)."""
        self._sums.clear()
        self._owned.clear()
