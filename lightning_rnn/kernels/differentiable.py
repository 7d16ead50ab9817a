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

from .cell import NORM_EPS
from .precision import autocast_off
from .steps import Steps


def lstm(x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, reverse, w_hr=None, norm_ih_weight=None,
         norm_ih_bias=None, norm_hh_weight=None, norm_hh_bias=None, norm_c_weight=None, norm_c_bias=None,
         recurrent_keep=None, recurrent_p=0.0, zoneout_c=0.0, zoneout_h=0.0, keep_c=None, keep_h=None,
         weight_keep=None, weight_p=0.0):
    """``(out (N, P), h_n (B, P), c_n (B, H))``, as the reference LSTMFunction, options included."""
    steps = Steps.from_batch_sizes(batch_sizes, reverse)
    w_hh = _dropped(w_hh, weight_keep, weight_p)
    norm = norm_ih_weight is not None
    if norm:
        a_x = _norm(F.linear(x, w_ih), norm_ih_weight, norm_ih_bias)
        pre = (a_x if b_ih is None else a_x + b_ih + b_hh).split(steps.batch_sizes)
    else:
        pre = F.linear(x, w_ih, b_ih).split(steps.batch_sizes)  # (n_t, 4H) per step, one GEMM for all
    scale = _recurrent_scale(recurrent_keep, recurrent_p, h0.dtype)
    h, c, outs = h0, c0, {}
    for t in steps.order():
        n, rows = steps.batch_sizes[t], steps.rows(t)
        h_in = h[:n] if scale is None else h[:n] * scale[:n]
        if norm:
            i, f, g, o = (pre[t] + _norm(F.linear(h_in, w_hh), norm_hh_weight, norm_hh_bias)).chunk(4, 1)
        else:
            i, f, g, o = (pre[t] + F.linear(h_in, w_hh, b_hh)).chunk(4, 1)
        c_t = f.sigmoid() * c[:n] + i.sigmoid() * g.tanh()
        y = _norm(c_t, norm_c_weight, norm_c_bias) if norm else c_t
        h_t = o.sigmoid() * y.tanh()
        if w_hr is not None:
            h_t = F.linear(h_t, w_hr)
        if zoneout_c:
            c_t = _zoneout(c[:n], c_t, zoneout_c, keep_c, rows)
        if zoneout_h:
            h_t = _zoneout(h[:n], h_t, zoneout_h, keep_h, rows)
        outs[t] = h_t
        h, c = _carry(h_t, h), _carry(c_t, c)
    return torch.cat([outs[t] for t in range(len(steps.batch_sizes))]), h, c


def gru(x, batch_sizes, h0, w_ih, w_hh, b_ih, b_hh, reverse, norm_ih_weight=None, norm_ih_bias=None,
        norm_hh_weight=None, norm_hh_bias=None, recurrent_keep=None, recurrent_p=0.0, zoneout_h=0.0, keep_h=None,
        weight_keep=None, weight_p=0.0):
    """``(out (N, H), h_n (B, H))``, as the reference GRUFunction (torch.nn's GRU math), options included."""
    steps = Steps.from_batch_sizes(batch_sizes, reverse)
    w_hh = _dropped(w_hh, weight_keep, weight_p)
    norm = norm_ih_weight is not None
    if norm:
        a_x = _norm(F.linear(x, w_ih), norm_ih_weight, norm_ih_bias)
        pre = (a_x if b_ih is None else a_x + b_ih).split(steps.batch_sizes)
    else:
        pre = F.linear(x, w_ih, b_ih).split(steps.batch_sizes)  # (n_t, 3H) per step
    scale = _recurrent_scale(recurrent_keep, recurrent_p, h0.dtype)
    h, outs = h0, {}
    for t in steps.order():
        n, rows = steps.batch_sizes[t], steps.rows(t)
        h_in = h[:n] if scale is None else h[:n] * scale[:n]
        x_r, x_z, x_n = pre[t].chunk(3, 1)
        if norm:
            a_h = _norm(F.linear(h_in, w_hh), norm_hh_weight, norm_hh_bias)
            h_r, h_z, h_n = (a_h if b_hh is None else a_h + b_hh).chunk(3, 1)
        else:
            h_r, h_z, h_n = F.linear(h_in, w_hh, b_hh).chunk(3, 1)
        r, z = (x_r + h_r).sigmoid(), (x_z + h_z).sigmoid()
        new = (x_n + r * h_n).tanh()
        h_t = new + z * (h[:n] - new)
        if zoneout_h:
            h_t = _zoneout(h[:n], h_t, zoneout_h, keep_h, rows)
        outs[t] = h_t
        h = _carry(h_t, h)
    return torch.cat([outs[t] for t in range(len(steps.batch_sizes))]), h


def _norm(a, weight, bias):
    return F.layer_norm(a, (a.shape[-1],), weight, bias, eps=NORM_EPS)


def _dropped(w, keep, p: float):
    return w if keep is None else w * keep.to(w.dtype) / (1 - p)


def _recurrent_scale(keep, p: float, dtype):
    return None if keep is None else keep.to(dtype) / (1 - p)


def _zoneout(prev, new, p: float, keep, rows):
    """Zoneout out of place: the mask's rows of this step (training) or its expectation p."""
    if keep is None:
        return new + p * (prev - new)
    return torch.where(keep[rows], prev, new)


def _carry(new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """The state after a step: its ``n`` new rows, then the rows of finished sequences."""
    return new if new.shape[0] == old.shape[0] else torch.cat([new, old[new.shape[0] :]])


_CELLS = {"lstm": lstm, "gru": gru}


def backward(
    cell: str, inputs: Sequence, needs: Sequence[bool], grad_outputs: Sequence[torch.Tensor], x_is_input: bool
) -> tuple:
    """The gradients of one layer-direction's outputs, as a graph autograd can differentiate.

    inputs: the Function's inputs in its order ``(x, batch_sizes, *states, w_ih, w_hh,
    b_ih, b_hh, reverse[, w_hr], *options)``, the tensors as saved (connected to the graph);
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
