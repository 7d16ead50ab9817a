"""The autograd side of a compiled kernel extension, shared by the cpp and cuda backends.

``lstm()``/``gru()`` record a plain forward with the extension's own C++ autograd node
(``csrc/rnn_autograd.h``); the autograd.Functions here record it where the node does not
serve (see :func:`_graph`): inside a GradSink and under forward-mode AD. Both have the
same signatures, semantics and saved tensors as :mod:`lightning_rnn.kernels.reference`:
saved are the layer input in the compute dtype, the activated gates (N, 4H) in the
compute dtype, h0, c0 and the weights (with the LSTM's projection w_hr, if any). The
extension does all the rest: the input projection GEMM, the time loop (one GEMM + one
fused pointwise pass per step; a second GEMM with a projection), the backward scan, the
backward loop and the weight-gradient GEMMs.

A backward with ``create_graph=True`` runs :mod:`lightning_rnn.kernels.differentiable`
instead of the extension, so that its gradients can be differentiated again.

Precisions the extension does not implement (e.g. bf16/fp16 *weights* without
autocast) run on the reference backend, which implements every precision.
"""
from __future__ import annotations

from types import ModuleType
from typing import Callable

import torch
from torch.autograd import forward_ad

from .. import differentiable, reference
from ..backends import Backend
from ..grad_sink import GradSink
from ..precision import Precision, autocast_off, compute_input
from .options import options_function

_SUPPORTED = {
    (torch.float32, torch.float32),
    (torch.float64, torch.float64),
    (torch.bfloat16, torch.float32),
    (torch.float16, torch.float32),
}


def _bias_dtype(b_ih):
    return None if b_ih is None else b_ih.dtype


def _cell_function(cell: str, num_states: int, get_ext: Callable[[], ModuleType]) -> type:
    """The autograd.Function of one direction of one ``cell`` layer ("lstm": 2 states, "gru": 1).

    Inputs: ``(x, batch_sizes, *states, w_ih, w_hh, b_ih, b_hh, reverse[, w_hr])``
    (``w_hr``: the LSTM's projection, or None); outputs: ``(out (N,P), *final_states)``.
    The extension's ops take and return the LSTM's arity for both cells (c0 / c_n / dc0
    and w_hr are None for the GRU).
    """

    def forward(ctx, x, batch_sizes, *args):
        states, (w_ih, w_hh, b_ih, b_hh, reverse, *rest) = args[:num_states], args[num_states:]
        c0 = states[1] if num_states == 2 else None
        w_hr = rest[0] if rest else None
        p = Precision.for_call(x, w_ih)
        out, h_n, c_n, gates, x_c = _run_forward(
            get_ext, cell, p, x, batch_sizes, states[0], c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse
        )
        ctx.batch_sizes, ctx.reverse, ctx.state = batch_sizes, bool(reverse), p.state
        ctx.bias_dtype, ctx.num_inputs, ctx.x_is_input = _bias_dtype(b_ih), 2 + len(args), x_c is x
        ctx.save_for_backward(x_c, gates, *states, w_ih, w_hh, b_ih, b_hh, w_hr)
        return (out, h_n, c_n)[: 1 + num_states]

    def backward(ctx, d_out, *d_states):
        x_c, gates, *states, w_ih, w_hh, b_ih, b_hh, w_hr = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: gradients that can be differentiated again
            inputs = (x_c, ctx.batch_sizes, *states, w_ih, w_hh, b_ih, b_hh, ctx.reverse, w_hr)[: ctx.num_inputs]
            grads = (d_out, *d_states)
            return differentiable.backward(cell, inputs, ctx.needs_input_grad, grads, ctx.x_is_input)
        c0, d_cn = (states[1], d_states[1]) if num_states == 2 else (None, None)
        # n: (x, batch_sizes, *states, w_ih, w_hh, b_ih, b_hh, reverse[, w_hr])
        n, w = ctx.needs_input_grad, 2 + num_states
        needs_w_hr = w_hr is not None and n[w + 5]
        needs = [n[0], n[2], num_states == 2 and n[3], n[w], n[w + 1], n[w + 2] or n[w + 3], needs_w_hr]
        sink = GradSink.current()  # checkpointed chunks: weight gradients summed in place
        into = [sink.into(v, x_c.dtype) if sink is not None else None for v in (w_ih, w_hh)]
        with autocast_off(x_c.device):
            dx, dh0, dc0, dw_ih, dw_hh, db_ih, db_hh, dw_hr = getattr(get_ext(), f"{cell}_backward")(
                x_c, gates, states[0], c0, w_ih, w_hh, w_hr, d_out, d_states[0], d_cn,
                ctx.batch_sizes, ctx.reverse, needs, ctx.state, ctx.bias_dtype, *into,
            )
        if sink is not None:
            dw_ih, dw_hh = sink.keep(w_ih, dw_ih, owned=True), sink.keep(w_hh, dw_hh, owned=True)
        grads = (dx, None, dh0, dc0)[: 2 + num_states] + (dw_ih, dw_hh, db_ih, db_hh, None, dw_hr)
        return grads[: ctx.num_inputs]

    doc = f"One direction of one {cell.upper()} layer on the compiled kernels (see the module docstring)."
    members = {"forward": staticmethod(forward), "backward": staticmethod(backward), "__doc__": doc}
    return type(f"{cell.upper()}Function", (torch.autograd.Function,), members)


def _run_forward(get_ext, cell: str, p: Precision, x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse):
    """The extension's forward: ``(out, h_n, c_n, gates, x_c)`` (c_n None for the GRU)."""
    run = getattr(get_ext(), f"{cell}_forward")
    with autocast_off(x.device):
        return run(x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, bool(reverse), p.compute, p.state)


_BARE, _NODE, _FUNCTION = range(3)


def _graph(*tensors) -> int:
    """How a call records its gradient: ``_BARE`` where nothing needs one (grad mode off or
    no tensor requiring grad); ``_NODE``, the extension's C++ autograd node
    (csrc/rnn_autograd.h), in a plain forward; the Python autograd.Function where it
    does what the node does not: inside a GradSink (gradient checkpointing sums the
    weight gradients in Python) and under forward-mode AD (the Function refuses dual
    tensors with a clear error, where a bare call would drop their tangents)."""
    if getattr(forward_ad, "_current_level", 0) >= 0:
        return _FUNCTION
    if not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)):
        return _BARE
    return _FUNCTION if GradSink.current() is not None else _NODE


def _stack_weights(weights: list, *tensors) -> list | None:
    """The weights of a stack call flattened (5 per layer-direction), or None where the
    stack declines them: weights of several dtypes (parametrized ones; the per-layer path
    converts between them), or a call the Python Function records (see :func:`_graph`;
    ``tensors``: the call's input and states)."""
    dtype = weights[0][0].dtype
    if any(w[0].dtype != dtype for w in weights):
        return None
    flat = [w for layer_weights in weights for w in layer_weights]
    return None if _graph(*tensors, *flat) == _FUNCTION else flat


def graph_backward(cell: str, inputs: tuple, needs: list, grads: list, x_is_input: bool) -> list:
    """A create_graph backward of the C++ node (csrc/rnn_autograd.h), which calls this:
    inputs in the node's order ``(x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr,
    reverse)`` (c0 and w_hr None for the GRU), needs one flag per tensor input up to w_hr;
    returns one gradient (or None) per input up to w_hr, by :func:`differentiable.backward`."""
    x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse = inputs
    n_x, _, n_h0, n_c0, n_ih, n_hh, n_bih, n_bhh, n_hr = needs
    if cell == "lstm":
        order = (x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, reverse, w_hr)
        flags = (n_x, False, n_h0, n_c0, n_ih, n_hh, n_bih, n_bhh, False, n_hr)
        dx, _, dh0, dc0, dw_ih, dw_hh, db_ih, db_hh, _, dw_hr = differentiable.backward(
            cell, order, flags, grads, x_is_input
        )
    else:
        order = (x, batch_sizes, h0, w_ih, w_hh, b_ih, b_hh, reverse)
        flags = (n_x, False, n_h0, n_ih, n_hh, n_bih, n_bhh, False)
        dx, _, dh0, dw_ih, dw_hh, db_ih, db_hh, _ = differentiable.backward(cell, order, flags, grads, x_is_input)
        dc0 = dw_hr = None
    return [dx, None, dh0, dc0, dw_ih, dw_hh, db_ih, db_hh, dw_hr]


def make_backend(name: str, devices: tuple[str, ...], get_ext: Callable[[], ModuleType],
                 weight_packs: Callable[[], object] | None = None) -> Backend:
    """The :class:`~lightning_rnn.kernels.backends.Backend` running the extension ``get_ext()``
    loads (which builds it on first use).

    ``lstm``/``gru`` record a plain forward with the extension's C++ autograd node (see
    :func:`_graph`), and run the extension directly, without any node, where nothing
    needs a gradient (inference, ``no_grad``, frozen layers): a node, its saved tensors
    and the autocast context cost more than the kernel itself in a one-step call
    (token-by-token generation). Precisions the extension lacks run on the reference
    backend's functions.
    """
    LSTMFunction = _cell_function("lstm", 2, get_ext)
    GRUFunction = _cell_function("gru", 1, get_ext)
    LSTMOptions, GRUOptions = options_function("lstm", get_ext), options_function("gru", get_ext)

    def lstm(x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, reverse, w_hr=None, extras=None):
        p = Precision.for_call(x, w_ih)
        if (p.compute, p.state) not in _SUPPORTED:
            return reference.lstm(x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, reverse, w_hr, extras=extras)
        x = compute_input(x, w_ih, p)
        if extras is not None:
            return LSTMOptions.apply(x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, reverse, w_hr,
                                     *extras.lstm_inputs())
        graph = _graph(x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr)
        if graph == _NODE:
            out = get_ext().lstm_apply(x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, bool(reverse),
                                       p.compute, p.state)
            return tuple(out)
        if graph == _FUNCTION:
            return LSTMFunction.apply(x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, reverse, w_hr)
        return _run_forward(get_ext, "lstm", p, x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse)[:3]

    def gru(x, batch_sizes, h0, w_ih, w_hh, b_ih, b_hh, reverse, extras=None):
        p = Precision.for_call(x, w_ih)
        if (p.compute, p.state) not in _SUPPORTED:
            return reference.gru(x, batch_sizes, h0, w_ih, w_hh, b_ih, b_hh, reverse, extras=extras)
        x = compute_input(x, w_ih, p)
        if extras is not None:
            return GRUOptions.apply(x, batch_sizes, h0, w_ih, w_hh, b_ih, b_hh, reverse, *extras.gru_inputs())
        graph = _graph(x, h0, w_ih, w_hh, b_ih, b_hh)
        if graph == _NODE:
            out = get_ext().gru_apply(x, batch_sizes, h0, None, w_ih, w_hh, b_ih, b_hh, None, bool(reverse),
                                      p.compute, p.state)
            return tuple(out)
        if graph == _FUNCTION:
            return GRUFunction.apply(x, batch_sizes, h0, w_ih, w_hh, b_ih, b_hh, reverse)
        return _run_forward(get_ext, "gru", p, x, batch_sizes, h0, None, w_ih, w_hh, b_ih, b_hh, None, reverse)[:2]

    def stack(cell, x, batch_sizes, states, weights, num_layers, num_directions):
        """A whole stack in one extension call (csrc/rnn_autograd.h: stack_apply), without
        inter-layer dropout: ``(out (N, D*P), [h_n, c_n])``; or None where a call needs what
        only the per-layer path has (a precision the extension lacks, weights of several
        dtypes, the Python Function: see :func:`_graph`). states: h0 (L*D, B, P) and the
        LSTM's c0; weights: per layer-direction, as the layers give them."""
        w_ih = weights[0][0]
        p = Precision.for_call(x, w_ih)
        if (p.compute, p.state) not in _SUPPORTED:
            return None
        x = compute_input(x, w_ih, p)
        flat = _stack_weights(weights, x, *states)
        if flat is None:
            return None
        ext = get_ext()
        run, c0 = (ext.lstm_stack, states[1]) if cell == "lstm" else (ext.gru_stack, None)
        out, *finals = run(x, batch_sizes, states[0], c0, flat, num_layers, num_directions, p.compute, p.state)
        return out, finals

    def padded(cell, x, h0, c0, weights, num_layers, num_directions):
        """:func:`stack`'s common call in one step (csrc/rnn_autograd.h: padded_stack_apply):
        x a padded, time-major (T, B, I) batch in the weights' dtype, one of
        ``PADDED_DTYPES``, outside autocast; h0 (L*D, B, P) and the LSTM's c0 (L*D, B, H)
        in x's dtype, or None for zeros. ``(out (T, B, D*P), [h_n, c_n])``, or None where
        :func:`stack` declines too."""
        flat = _stack_weights(weights, x, h0, c0)
        if flat is None:
            return None
        out, *finals = getattr(get_ext(), f"{cell}_padded")(x, h0, c0, flat, num_layers, num_directions)
        return out, finals

    return Backend(
        name=name, devices=devices, load=get_ext, lstm=lstm, gru=gru, stack=stack, padded=padded,
        padded_dtypes=PADDED_DTYPES, weight_packs=weight_packs, functions=(LSTMFunction, GRUFunction),
        cell_options=True,
    )


#: Dtypes of the padded common call: what the extension computes in without autocast.
PADDED_DTYPES = (torch.float32, torch.float64)
