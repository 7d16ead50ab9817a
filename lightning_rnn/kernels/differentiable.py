"""One direction of one layer as a graph of torch ops: gradients of gradients.

The reference and compiled backends' backward passes are hand-written, so autograd
cannot differentiate them. When a backward runs with ``create_graph=True`` (a gradient
penalty, a Hessian-vector product, meta-learning), their Functions instead rerun the
layer-direction from their saved inputs with the functions below and let autograd
differentiate that graph; the gradients it returns can be differentiated again, as often
as wanted.

Same math, shapes and packed layout as :mod:`lightning_rnn.kernels.reference`, written
out of place so that autograd can record it; the input projection is split into steps
rather than indexed per step (the backward of each N-row index would cost O(N), O(T^2) in
all). It computes in the weights' dtype (under autocast too: the gradients of a
create_graph backward are fp32 ones), and it costs one more forward of the
layer-direction, with autograd's own activation memory, per such backward; a plain
backward never comes here.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from .precision import autocast_off
from .steps import Steps


def lstm(x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, reverse, w_hr=None):
    """``(out (N, P), h_n (B, P), c_n (B, H))``, as :func:`reference.lstm`."""
    steps = Steps.from_batch_sizes(batch_sizes, reverse)
    pre = F.linear(x, w_ih, b_ih).split(steps.batch_sizes)  # (n_t, 4H) per step, one GEMM for all
    h, c, outs = h0, c0, {}
    for t in steps.order():
        n = steps.batch_sizes[t]
        i, f, g, o = (pre[t] + F.linear(h[:n], w_hh, b_hh)).chunk(4, 1)
        c_t = f.sigmoid() * c[:n] + i.sigmoid() * g.tanh()
        h_t = o.sigmoid() * c_t.tanh()
        if w_hr is not None:
            h_t = F.linear(h_t, w_hr)
        outs[t] = h_t
        h, c = _carry(h_t, h), _carry(c_t, c)
    return torch.cat([outs[t] for t in range(len(steps.batch_sizes))]), h, c


def gru(x, batch_sizes, h0, w_ih, w_hh, b_ih, b_hh, reverse):
    """``(out (N, H), h_n (B, H))``, as :func:`reference.gru` (torch.nn's GRU math)."""
    steps = Steps.from_batch_sizes(batch_sizes, reverse)
    pre = F.linear(x, w_ih, b_ih).split(steps.batch_sizes)  # (n_t, 3H) per step
    h, outs = h0, {}
    for t in steps.order():
        n = steps.batch_sizes[t]
        x_r, x_z, x_n = pre[t].chunk(3, 1)
        h_r, h_z, h_n = F.linear(h[:n], w_hh, b_hh).chunk(3, 1)
        r, z = (x_r + h_r).sigmoid(), (x_z + h_z).sigmoid()
        new = (x_n + r * h_n).tanh()
        h_t = new + z * (h[:n] - new)
        outs[t] = h_t
        h = _carry(h_t, h)
    return torch.cat([outs[t] for t in range(len(steps.batch_sizes))]), h


def _carry(new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """The state after a step: its ``n`` new rows, then the rows of finished sequences."""
    return new if new.shape[0] == old.shape[0] else torch.cat([new, old[new.shape[0] :]])


_CELLS = {"lstm": lstm, "gru": gru}


def backward(
    cell: str, inputs: Sequence, needs: Sequence[bool], grad_outputs: Sequence[torch.Tensor], x_is_input: bool
) -> tuple:
    """The gradients of one layer-direction's outputs, as a graph autograd can differentiate.

    inputs: the Function's inputs in its order ``(x, batch_sizes, *states, w_ih, w_hh,
    b_ih, b_hh, reverse[, w_hr])``, the tensors as saved (connected to the graph);
    needs: ``ctx.needs_input_grad``; x_is_input: whether the saved x is the Function's
    input itself (not a cast or contiguous copy made inside it, which the graph does not
    connect to x). Returns one gradient (or None) per input.
    """
    if needs[0] and not x_is_input:
        raise RuntimeError(
            "x: a backward with create_graph=True needs the kernel's input in its compute dtype and "
            "contiguous (call the backend's lstm()/gru(), which cast it first, not the Function itself)"
        )
    num_states = 2 if cell == "lstm" else 1
    dtype = inputs[2 + num_states].dtype  # w_ih's
    tensors = [isinstance(t, torch.Tensor) and t.is_floating_point() for t in inputs]
    wrt = [t for t, is_tensor, need in zip(inputs, tensors, needs) if is_tensor and need]
    with torch.enable_grad(), autocast_off(inputs[0].device):
        args = [t.to(dtype) if is_tensor else t for t, is_tensor in zip(inputs, tensors)]
        pairs = [(o, g.to(dtype)) for o, g in zip(_CELLS[cell](*args), grad_outputs) if o.requires_grad]
        outputs, grads = zip(*pairs)  # e.g. c_n of one step does not depend on w_hr
        grads = iter(torch.autograd.grad(outputs, wrt, grads, create_graph=True, allow_unused=True))
    return tuple(next(grads) if is_tensor and need else None for is_tensor, need in zip(tensors, needs))
