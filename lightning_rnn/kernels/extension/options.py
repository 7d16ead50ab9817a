"""The compiled backends' calls with cell options (layer norm, zoneout, recurrent dropout).

One ``torch.autograd.Function`` per cell with the reference Functions' inputs, outputs and
saved tensors (kernels/reference/lstm.py, gru.py): the extension's ``*_options_forward``
and ``*_options_backward`` (csrc/rnn_driver_options.h) compute them. A backward with
``create_graph=True`` runs :mod:`lightning_rnn.kernels.differentiable` from the same inputs,
as the reference does.
"""
from __future__ import annotations

from types import ModuleType
from typing import Callable

import torch

from .. import differentiable
from ..precision import Precision, autocast_off


def options_function(cell: str, get_ext: Callable[[], ModuleType]) -> type:
    """The autograd.Function of one ``cell`` ("lstm" or "gru") layer-direction with options.

    Inputs, as the reference Function's: LSTM ``(x, batch_sizes, h0, c0, w_ih, w_hh, b_ih,
    b_hh, reverse, w_hr, *norm (6), recurrent_keep, recurrent_p, zoneout_c, zoneout_h,
    keep_c, keep_h, weight_keep, weight_p)``; GRU ``(x, batch_sizes, h0, w_ih, w_hh, b_ih,
    b_hh, reverse, *norm (4), recurrent_keep, recurrent_p, zoneout_h, keep_h, weight_keep,
    weight_p)``.
    """
    lstm = cell == "lstm"
    num_norm = 6 if lstm else 4

    def unpack(args):
        """(h0, c0, w_ih, w_hh, b_ih, b_hh, reverse, w_hr, norm, rec_keep, rec_p, p_c, p_h, keep_c, keep_h,
        weight_keep, weight_p)"""
        if lstm:
            h0, c0, w_ih, w_hh, b_ih, b_hh, reverse, w_hr, *rest = args
            norm, (rec_keep, rec_p, p_c, p_h, keep_c, keep_h, w_keep, w_p) = rest[:num_norm], rest[num_norm:]
        else:
            h0, w_ih, w_hh, b_ih, b_hh, reverse, *rest = args
            c0 = w_hr = keep_c = None
            p_c = 0.0
            norm, (rec_keep, rec_p, p_h, keep_h, w_keep, w_p) = rest[:num_norm], rest[num_norm:]
        return (h0, c0, w_ih, w_hh, b_ih, b_hh, reverse, w_hr, list(norm), rec_keep, rec_p, p_c, p_h, keep_c, keep_h,
                w_keep, w_p)

    def forward(ctx, x, batch_sizes, *args):
        (h0, c0, w_ih, w_hh, b_ih, b_hh, reverse, w_hr, norm, rec_keep, rec_p, p_c, p_h, keep_c, keep_h, w_keep,
         w_p) = unpack(args)
        p = Precision.for_call(x, w_ih)
        norm_in = norm if norm[0] is not None else []
        with autocast_off(x.device):
            out, h_n, c_n, gates, x_c, a_h, stats_h, stats_c = getattr(get_ext(), f"{cell}_options_forward")(
                x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, bool(reverse), p.compute, p.state, norm_in,
                rec_keep, float(rec_p), float(p_c), float(p_h), keep_c, keep_h, w_keep, float(w_p),
            )
        ctx.batch_sizes, ctx.reverse, ctx.state, ctx.x_is_input = batch_sizes, bool(reverse), p.state, x_c is x
        ctx.bias_dtype = None if b_ih is None else b_ih.dtype
        ctx.probabilities, ctx.num_inputs = (rec_p, p_c, p_h, w_p), 2 + len(args)
        ctx.save_for_backward(x_c, gates, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, *norm, rec_keep, keep_c, keep_h,
                              w_keep, a_h, stats_h, stats_c)
        return (out, h_n, c_n) if lstm else (out, h_n)

    def backward(ctx, d_out, d_hn, d_cn=None):
        saved = ctx.saved_tensors
        x_c, gates, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr = saved[:9]
        norm = list(saved[9 : 9 + num_norm])
        rec_keep, keep_c, keep_h, w_keep, a_h, stats_h, stats_c = saved[9 + num_norm :]
        rec_p, p_c, p_h, w_p = ctx.probabilities
        if torch.is_grad_enabled():  # create_graph=True: gradients that can be differentiated again
            if lstm:
                inputs = (x_c, ctx.batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, ctx.reverse, w_hr, *norm, rec_keep,
                          rec_p, p_c, p_h, keep_c, keep_h, w_keep, w_p)
                grads = (d_out, d_hn, d_cn)
            else:
                inputs = (x_c, ctx.batch_sizes, h0, w_ih, w_hh, b_ih, b_hh, ctx.reverse, *norm, rec_keep, rec_p, p_h,
                          keep_h, w_keep, w_p)
                grads = (d_out, d_hn)
            return differentiable.backward(cell, inputs, ctx.needs_input_grad, grads, ctx.x_is_input)
        n = ctx.needs_input_grad
        s = 2 + (2 if lstm else 1)  # w_ih's place
        norm_at = s + 4 + (2 if lstm else 1)  # after reverse (and the LSTM's w_hr)
        needs = [n[0], n[2], lstm and n[3], n[s], n[s + 1], n[s + 2] or n[s + 3],
                 lstm and w_hr is not None and n[s + 5], any(n[norm_at : norm_at + num_norm])]
        norm_in = norm if norm[0] is not None else []
        with autocast_off(x_c.device):
            g = getattr(get_ext(), f"{cell}_options_backward")(
                x_c, gates, h0, c0, w_ih, w_hh, w_hr, d_out, d_hn, d_cn if lstm else None, ctx.batch_sizes,
                ctx.reverse, needs, ctx.state, ctx.bias_dtype, norm_in, rec_keep, float(rec_p), float(p_c),
                float(p_h), keep_c, keep_h, w_keep, float(w_p), a_h, stats_h, stats_c,
            )
        dx, dh0, dc0, dw_ih, dw_hh, db_ih, db_hh, dw_hr, *d_norm = g  # None where not needed
        d_norm = d_norm if norm_in else [None] * num_norm
        if lstm:
            return (dx, None, dh0, dc0, dw_ih, dw_hh, db_ih, db_hh, None, dw_hr, *d_norm) + (None,) * 8
        return (dx, None, dh0, dw_ih, dw_hh, db_ih, db_hh, None, *d_norm) + (None,) * 6

    doc = f"One direction of one {cell.upper()} layer with cell options on the compiled kernels."
    members = {"forward": staticmethod(forward), "backward": staticmethod(backward), "__doc__": doc}
    return type(f"{cell.upper()}OptionsFunction", (torch.autograd.Function,), members)

