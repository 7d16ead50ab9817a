"""Small pieces the reference LSTM and GRU share: the input GEMM, scans, activation
gradients, layer normalization over rows, zoneout and recurrent dropout.

Rows are tokens (packed, time-major; see :mod:`lightning_rnn.kernels.steps`), columns the
features of one gate block or state. Everything here runs in the state dtype unless it says
otherwise.
"""
from __future__ import annotations

import torch

from ..cell import NORM_EPS
from ..precision import Precision
from ..steps import Steps


def project_input(x_c: torch.Tensor, w_ih_c: torch.Tensor, bias, state_dtype) -> torch.Tensor:
    """(N, I) @ (I, G*H) + bias for all timesteps in one GEMM, returned in the state dtype."""
    pre = torch.mm(x_c, w_ih_c.t()).to(state_dtype)
    if bias is not None:
        pre += bias
    return pre


def scan(steps: Steps, init: torch.Tensor, update) -> torch.Tensor:
    """(N, H) state after every token: ``s_t = update(s_{t-1}, rows of step t)`` from ``init`` (B, H)."""
    out = init.new_empty(steps.num_rows, init.shape[1])
    state = init.clone()
    for t in steps.order():
        rows, n = steps.rows(t), steps.batch_sizes[t]
        state[:n] = update(state[:n], rows)
        out[rows] = state[:n]
    return out


def sigmoid_grad(y: torch.Tensor) -> torch.Tensor:
    return y * (1 - y)


def tanh_grad(y: torch.Tensor) -> torch.Tensor:
    return 1 - y * y


def addmm_(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc += a @ b, with acc possibly in a wider dtype than a and b (mixed precision)."""
    if acc.dtype == a.dtype:
        acc.addmm_(a, b)
    else:
        acc += torch.mm(a, b)


# ---- layer normalization over the columns of each row ------------------------------------
def norm_stats(a: torch.Tensor) -> torch.Tensor:
    """(n, 2) [mean, 1 / sqrt(var + eps)] of each row of ``a`` (n, F), biased variance."""
    var, mean = torch.var_mean(a, dim=1, keepdim=True, unbiased=False)
    return torch.cat([mean, (var + NORM_EPS).rsqrt()], dim=1)


def normalized(a: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:
    """(a - mean) * rstd per row: the normalized value before gain and bias."""
    return (a - stats[:, :1]) * stats[:, 1:]


def norm_backward(dy: torch.Tensor, a_hat: torch.Tensor, stats: torch.Tensor, weight: torch.Tensor):
    """The gradient of ``y = weight * a_hat + bias`` with respect to the input ``a`` (n, F)."""
    g = dy * weight
    return stats[:, 1:] * (g - g.mean(1, keepdim=True) - a_hat * (g * a_hat).mean(1, keepdim=True))


# ---- zoneout: keep the previous value where the mask says so ------------------------------
def zoneout(prev: torch.Tensor, new: torch.Tensor, p: float, keep_prev: torch.Tensor | None) -> torch.Tensor:
    """``d * prev + (1 - d) * new`` with d the bool mask ``keep_prev`` (training), or its
    expectation p where there is none (evaluation)."""
    if keep_prev is None:
        return new + p * (prev - new)
    return torch.where(keep_prev, prev, new)


def zoneout_grads(d: torch.Tensor, p: float, keep_prev: torch.Tensor | None):
    """The gradients of :func:`zoneout` with respect to ``(prev, new)`` for its output's ``d``."""
    if keep_prev is None:
        return p * d, (1 - p) * d
    return torch.where(keep_prev, d, 0.0), torch.where(keep_prev, 0.0, d)


# ---- weight drop -------------------------------------------------------------------------
def dropped_weight(w: torch.Tensor, keep: torch.Tensor | None, p: float) -> torch.Tensor:
    """DropConnect: ``w * keep / (1 - p)``, or w itself without a mask."""
    return w if keep is None else w * keep.to(w.dtype) / (1 - p)


# ---- recurrent (variational) dropout -----------------------------------------------------
def recurrent_scale(keep: torch.Tensor | None, p: float, dtype: torch.dtype) -> torch.Tensor | None:
    """(B, 1 or P) factors ``keep / (1 - p)`` applied to h_{t-1} before W_hh, or None."""
    if keep is None:
        return None
    return keep.to(dtype) / (1 - p)


def rows_of(mask: torch.Tensor | None, rows: slice) -> torch.Tensor | None:
    """A token mask's rows of one step (None stays None: evaluation, or the option off)."""
    return None if mask is None else mask[rows]


def zoneout_scan(steps: Steps, init: torch.Tensor, new, p: float, keep: torch.Tensor | None):
    """``(s_all, new_all)`` (N, ·): the zoned-out state after every token,
    ``s_t = zoneout(s_{t-1}, new(s_{t-1}, rows))``, and the ``new`` values it mixed in."""
    s_all, new_all = init.new_empty(steps.num_rows, init.shape[1]), init.new_empty(steps.num_rows, init.shape[1])
    state = init.clone()
    for t in steps.order():
        rows, n = steps.rows(t), steps.batch_sizes[t]
        new_all[rows] = value = new(state[:n], rows)
        state[:n] = zoneout(state[:n], value, p, rows_of(keep, rows))
        s_all[rows] = state[:n]
    return s_all, new_all


def input_norm_backward(dG: torch.Tensor, x_c: torch.Tensor, w_ih_c: torch.Tensor, weight: torch.Tensor,
                        p: Precision):
    """``(dA_x, (d_weight, d_bias))`` of the input side's ``LN_ih(x W_ih^T)``, for all tokens at
    once; ``x W_ih^T`` is recomputed (one GEMM) rather than saved. ``dG`` (N, F): the gradient
    of the gate pre-activations, whose first F columns are the norm's output (F = G*H)."""
    F = weight.shape[0]
    a_x = project_input(x_c, w_ih_c, None, p.state)
    stats = norm_stats(a_x)
    a_hat = normalized(a_x, stats)
    d = dG[:, :F]
    return norm_backward(d, a_hat, stats, weight), ((d * a_hat).sum(0), d.sum(0))
