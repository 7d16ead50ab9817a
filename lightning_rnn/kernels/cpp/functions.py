"""autograd.Functions over a compiled kernel extension (shared by the cpp and cuda backends).

Same signatures, semantics and saved tensors as :mod:`lightning_rnn.kernels.reference`:
saved are the layer input in the compute dtype, the activated gates (N, 4H) in the
compute dtype, h0, c0 and the weights. The extension does all the rest: the input
projection GEMM, the time loop (one GEMM + one fused pointwise pass per step), the
backward scan, the backward loop and the weight-gradient GEMMs.

Precisions the extension does not implement (e.g. bf16/fp16 *weights* without
autocast) run on the reference backend, which implements every precision.
"""
from __future__ import annotations

from types import ModuleType
from typing import Callable

import torch

from .. import reference
from ..precision import Precision, autocast_off

_SUPPORTED = {
    (torch.float32, torch.float32),
    (torch.float64, torch.float64),
    (torch.bfloat16, torch.float32),
    (torch.float16, torch.float32),
}


def _bias_dtype(b_ih):
    return None if b_ih is None else b_ih.dtype


def make_functions(get_ext: Callable[[], ModuleType]):
    """Returns ``(lstm, gru)`` running the extension that ``get_ext()`` loads."""

    class LSTMFunction(torch.autograd.Function):
        """One direction of one LSTM layer. Returns ``(out (N,H), h_n (B,H), c_n (B,H))``."""

        @staticmethod
        def forward(ctx, x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, reverse):
            p = Precision.for_call(x, w_ih)
            with autocast_off(x.device):
                out, h_n, c_n, gates, x_c = get_ext().lstm_forward(
                    x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, bool(reverse), p.compute, p.state
                )
            ctx.batch_sizes, ctx.reverse, ctx.state = batch_sizes, bool(reverse), p.state
            ctx.bias_dtype = _bias_dtype(b_ih)
            ctx.save_for_backward(x_c, gates, h0, c0, w_ih, w_hh)
            return out, h_n, c_n

        @staticmethod
        def backward(ctx, d_out, d_hn, d_cn):
            x_c, gates, h0, c0, w_ih, w_hh = ctx.saved_tensors
            n = ctx.needs_input_grad
            needs = [n[0], n[2], n[3], n[4], n[5], n[6] or n[7]]
            with autocast_off(x_c.device):
                dx, dh0, dc0, dw_ih, dw_hh, db_ih, db_hh = get_ext().lstm_backward(
                    x_c, gates, h0, c0, w_ih, w_hh, d_out, d_hn, d_cn,
                    ctx.batch_sizes, ctx.reverse, needs, ctx.state, ctx.bias_dtype,
                )
            return dx, None, dh0, dc0, dw_ih, dw_hh, db_ih, db_hh, None

    class GRUFunction(torch.autograd.Function):
        """One direction of one GRU layer. Returns ``(out (N,H), h_n (B,H))``."""

        @staticmethod
        def forward(ctx, x, batch_sizes, h0, w_ih, w_hh, b_ih, b_hh, reverse):
            p = Precision.for_call(x, w_ih)
            with autocast_off(x.device):
                out, h_n, _, gates, x_c = get_ext().gru_forward(
                    x, batch_sizes, h0, None, w_ih, w_hh, b_ih, b_hh, bool(reverse), p.compute, p.state
                )
            ctx.batch_sizes, ctx.reverse, ctx.state = batch_sizes, bool(reverse), p.state
            ctx.bias_dtype = _bias_dtype(b_ih)
            ctx.save_for_backward(x_c, gates, h0, w_ih, w_hh)
            return out, h_n

        @staticmethod
        def backward(ctx, d_out, d_hn):
            x_c, gates, h0, w_ih, w_hh = ctx.saved_tensors
            n = ctx.needs_input_grad
            needs = [n[0], n[2], False, n[3], n[4], n[5] or n[6]]
            with autocast_off(x_c.device):
                dx, dh0, _, dw_ih, dw_hh, db_ih, db_hh = get_ext().gru_backward(
                    x_c, gates, h0, None, w_ih, w_hh, d_out, d_hn, None,
                    ctx.batch_sizes, ctx.reverse, needs, ctx.state, ctx.bias_dtype,
                )
            return dx, None, dh0, dw_ih, dw_hh, db_ih, db_hh, None

    def supported(x, w_ih) -> bool:
        p = Precision.for_call(x, w_ih)
        return (p.compute, p.state) in _SUPPORTED

    def lstm(x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, reverse):
        if not supported(x, w_ih):
            return reference.lstm(x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, reverse)
        return LSTMFunction.apply(x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, reverse)

    def gru(x, batch_sizes, h0, w_ih, w_hh, b_ih, b_hh, reverse):
        if not supported(x, w_ih):
            return reference.gru(x, batch_sizes, h0, w_ih, w_hh, b_ih, b_hh, reverse)
        return GRUFunction.apply(x, batch_sizes, h0, w_ih, w_hh, b_ih, b_hh, reverse)

    return LSTMFunction, GRUFunction, lstm, gru
