"""The two public layers: each is the shared driver plus a cell description."""
from __future__ import annotations

from torch import nn

from ..kernels.cell import GRU, LSTM
from .recurrent import FusedRNNBase


class FusedLSTM(FusedRNNBase):
    """Drop-in replacement for :class:`torch.nn.LSTM`.

    Gates ``i, f, g, o`` as in torch.nn; ``forward(input, (h_0, c_0)=None)`` returns
    ``(output, (h_n, c_n))``. The state dict uses torch.nn's key names and shapes. With
    ``proj_size = P > 0`` each layer's ``h_t = (o * tanh(c_t)) W_hr^T`` has P columns
    (``weight_hr_l{k}``, shape (P, H)): output and h_n have P per direction, c_n keeps H.
    """

    cell = LSTM
    torch_class = nn.LSTM


class FusedGRU(FusedRNNBase):
    """Drop-in replacement for :class:`torch.nn.GRU`.

    Gates ``r, z, n`` with torch/cuDNN's ``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))``;
    ``forward(input, h_0=None)`` returns ``(output, h_n)``.
    """

    cell = GRU
    torch_class = nn.GRU
