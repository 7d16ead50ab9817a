"""Reference backend: one direction of one LSTM/GRU layer in plain torch ops.

This is the executable specification every compiled backend is tested against.
Each cell is a ``torch.autograd.Function`` that

1. projects the input of ALL timesteps with one GEMM: ``(N, I) @ (I, G*H)``,
2. runs the time loop with only ``h @ W_hh^T`` and in-place gate math per step,
3. saves only the layer input, the activated gates (low precision under autocast)
   and the initial state; ``c_t``/``h_t`` are rebuilt in backward by a pointwise scan,
4. runs a hand-written backward time loop, then computes the weight gradients as
   large GEMMs over all N rows at once;
5. under ``create_graph=True`` hands the backward to :mod:`.differentiable` instead, so
   that its gradients can be differentiated again.

Shapes (packed time-major, see :mod:`lightning_rnn.kernels.steps`):
    x        (N, I)     N = sum(batch_sizes) real tokens
    h0, c0   (B, H)     B = batch_sizes[0], rows sorted by length (longest first)
    w_ih     (G*H, I)   torch.nn layout and gate order (LSTM: i, f, g, o; GRU: r, z, n)
    w_hh     (G*H, H)
    b_ih, b_hh (G*H,) or None
    out      (N, H)
Saved gates: LSTM (N, 4H) = activated [i, f, g, o]; GRU (N, 4H) = [r, z, n, W_hn h + b_hn].

LSTM with a projection (torch.nn.LSTM's ``proj_size = P``): ``w_hr (P, H)`` maps
``o * tanh(c_t)`` to ``h_t = (o * tanh(c_t)) W_hr^T``, so h0, h_n and out have P columns
and ``w_hh`` is ``(4H, P)``; c0 and c_n keep H. Nothing more is saved: ``o * tanh(c_t)``
is rebuilt from the gates and the rebuilt c_t, ``h_t`` from it by one GEMM over all rows.
"""
from __future__ import annotations

import torch

from . import differentiable
from .backends import Backend
from .precision import Precision, autocast_off, compute_input
from .steps import Steps, gather_prev


def _project_input(x_c: torch.Tensor, w_ih_c: torch.Tensor, bias, state_dtype) -> torch.Tensor:
    """(N, I) @ (I, G*H) + bias for all timesteps in one GEMM, returned in the state dtype."""
    pre = torch.mm(x_c, w_ih_c.t()).to(state_dtype)
    if bias is not None:
        pre += bias
    return pre


def _scan(steps: Steps, init: torch.Tensor, update) -> torch.Tensor:
    """(N, H) state after every token: ``s_t = update(s_{t-1}, rows of step t)`` from ``init`` (B, H)."""
    out = init.new_empty(steps.num_rows, init.shape[1])
    state = init.clone()
    for t in steps.order():
        rows, n = steps.rows(t), steps.batch_sizes[t]
        state[:n] = update(state[:n], rows)
        out[rows] = state[:n]
    return out


def _sigmoid_grad(y: torch.Tensor) -> torch.Tensor:
    return y * (1 - y)


def _tanh_grad(y: torch.Tensor) -> torch.Tensor:
    return 1 - y * y


def _addmm_(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc += a @ b, with acc possibly in a wider dtype than a and b (mixed precision)."""
    if acc.dtype == a.dtype:
        acc.addmm_(a, b)
    else:
        acc += torch.mm(a, b)


class LSTMFunction(torch.autograd.Function):
    """One direction of one LSTM layer, optionally projected (``w_hr``). Returns ``(out, h_n, c_n)``."""

    @staticmethod
    def forward(ctx, x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, reverse, w_hr=None):
        steps = Steps.from_batch_sizes(batch_sizes, reverse)
        p = Precision.for_call(x, w_ih)
        H, P = c0.shape[1], h0.shape[1]
        with autocast_off(x.device):
            x_c, w_hh_c = x.to(p.compute), w_hh.to(p.compute)
            w_hr_c = None if w_hr is None else w_hr.to(p.compute)
            bias = None if b_ih is None else (b_ih + b_hh).to(p.state)
            gates = _project_input(x_c, w_ih.to(p.compute), bias, p.state)  # (N, 4H)
            out = x.new_empty(steps.num_rows, P, dtype=p.compute)
            h, c = h0.to(p.state).clone(), c0.to(p.state).clone()  # (B, P), (B, H)
            for t in steps.order():
                rows, n = steps.rows(t), steps.batch_sizes[t]
                g = gates[rows]  # (n, 4H)
                _addmm_(g, h[:n].to(p.compute), w_hh_c.t())
                g[:, : 2 * H].sigmoid_()
                g[:, 2 * H : 3 * H].tanh_()
                g[:, 3 * H :].sigmoid_()
                i, f, gg, o = g.chunk(4, 1)
                c[:n].mul_(f).addcmul_(i, gg)
                h[:n] = _project(o * c[:n].tanh(), w_hr_c, p)
                out[rows] = h[:n]
        ctx.steps, ctx.precision, ctx.batch_sizes, ctx.x_is_input = steps, p, batch_sizes, x_c is x
        ctx.bias_dtype = None if b_ih is None else b_ih.dtype
        ctx.save_for_backward(x_c, gates.to(p.compute), h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr)
        return out, h.to(p.compute), c

    @staticmethod
    def backward(ctx, d_out, d_hn, d_cn):
        x_c, gates_c, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: gradients that can be differentiated again
            inputs = (x_c, ctx.batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, ctx.steps.reverse, w_hr)
            grads = (d_out, d_hn, d_cn)
            return differentiable.backward("lstm", inputs, ctx.needs_input_grad, grads, ctx.x_is_input)
        steps, p = ctx.steps, ctx.precision
        H = c0.shape[1]
        with autocast_off(x_c.device):
            gates = gates_c.to(p.state)
            i_all, f_all, g_all, o_all = gates.chunk(4, 1)
            # Rebuild c_t for every token with a pointwise scan: c_t = f * c_{t-1} + i * g.
            c_all = _scan(steps, c0.to(p.state), lambda c, r: f_all[r] * c + i_all[r] * g_all[r])
            tanh_c = c_all.tanh()
            prev = steps.prev_index(x_c.device)
            c_prev = gather_prev(c0.to(p.state), c_all, prev)

            w_hh_c = w_hh.to(p.compute)
            w_hr_c = None if w_hr is None else w_hr.to(p.compute)
            dG = torch.empty_like(gates)  # (N, 4H) gradients of the gate pre-activations
            dH = None if w_hr is None else d_out.new_empty(d_out.shape, dtype=p.state)  # (N, P) dL/dh_t
            dh, dc = d_hn.to(p.state).clone(), d_cn.to(p.state).clone()
            d_out = d_out.to(p.state)
            for t in reversed(steps.order()):
                rows, n = steps.rows(t), steps.batch_sizes[t]
                i, f, g, o = gates[rows].chunk(4, 1)
                dh_t, dc_t, tc = dh[:n], dc[:n], tanh_c[rows]
                dh_t += d_out[rows]
                if w_hr is not None:  # back through h_t = r_t W_hr^T to r_t = o * tanh(c_t)
                    dH[rows] = dh_t
                    dh_t = torch.mm(dh_t.to(p.compute), w_hr_c).to(p.state)
                dc_t += dh_t * o * _tanh_grad(tc)
                D = dG[rows]
                D[:, :H] = dc_t * g * _sigmoid_grad(i)
                D[:, H : 2 * H] = dc_t * c_prev[rows] * _sigmoid_grad(f)
                D[:, 2 * H : 3 * H] = dc_t * i * _tanh_grad(g)
                D[:, 3 * H :] = dh_t * tc * _sigmoid_grad(o)
                dc_t.mul_(f)
                dh[:n] = torch.mm(D.to(p.compute), w_hh_c).to(p.state)

            dG_c = dG.to(p.compute)
            need = ctx.needs_input_grad
            dx = torch.mm(dG_c, w_ih.to(p.compute)).to(x_c.dtype) if need[0] else None
            dw_ih = torch.mm(dG_c.t(), x_c).to(w_ih.dtype) if need[4] else None
            r_all = o_all * tanh_c  # (N, H): o * tanh(c_t), the cell's output before any projection
            dw_hh = dw_hr = None
            if need[5]:
                h_all = _project(r_all, w_hr_c, p)
                h_prev = gather_prev(h0.to(p.state), h_all, prev).to(p.compute)
                dw_hh = torch.mm(dG_c.t(), h_prev).to(w_hh.dtype)
            if w_hr is not None and need[9]:
                dw_hr = torch.mm(dH.to(p.compute).t(), r_all.to(p.compute)).to(w_hr.dtype)
            db = dG.sum(0).to(ctx.bias_dtype) if ctx.bias_dtype is not None else None
        dh0 = dh.to(h0.dtype) if need[2] else None
        dc0 = dc.to(c0.dtype) if need[3] else None
        return dx, None, dh0, dc0, dw_ih, dw_hh, db, db, None, dw_hr


def _project(r: torch.Tensor, w_hr_c: torch.Tensor | None, p: Precision) -> torch.Tensor:
    """h = r W_hr^T (GEMM in the compute dtype, result in the state dtype); r itself without a projection."""
    return r if w_hr_c is None else torch.mm(r.to(p.compute), w_hr_c.t()).to(p.state)


class GRUFunction(torch.autograd.Function):
    """One direction of one GRU layer (torch/cuDNN math: r gates ``W_hn h + b_hn``).

    Returns ``(out, h_n)``.
    """

    @staticmethod
    def forward(ctx, x, batch_sizes, h0, w_ih, w_hh, b_ih, b_hh, reverse):
        steps = Steps.from_batch_sizes(batch_sizes, reverse)
        p = Precision.for_call(x, w_ih)
        H = w_hh.shape[1]
        with autocast_off(x.device):
            x_c, w_hh_c = x.to(p.compute), w_hh.to(p.compute)
            bias, b_hn = None, None
            if b_ih is not None:  # b_hr, b_hz fold into the input projection; b_hn cannot
                bias = (b_ih + torch.cat([b_hh[: 2 * H], torch.zeros_like(b_hh[2 * H :])])).to(p.state)
                b_hn = b_hh[2 * H :].to(p.state)
            pre_x = _project_input(x_c, w_ih.to(p.compute), bias, p.state)  # (N, 3H)
            gates = pre_x.new_empty(steps.num_rows, 4 * H)  # [r, z, n, hn]
            out = x.new_empty(steps.num_rows, H, dtype=p.compute)
            h = h0.to(p.state).clone()  # (B, H)
            for t in steps.order():
                rows, n = steps.rows(t), steps.batch_sizes[t]
                hw = torch.mm(h[:n].to(p.compute), w_hh_c.t()).to(p.state)  # (n, 3H)
                if b_hn is not None:
                    hw[:, 2 * H :] += b_hn
                px, G = pre_x[rows], gates[rows]
                torch.sigmoid(px[:, : 2 * H] + hw[:, : 2 * H], out=G[:, : 2 * H])
                r, z = G[:, :H], G[:, H : 2 * H]
                G[:, 3 * H :] = hw[:, 2 * H :]
                G[:, 2 * H : 3 * H] = torch.tanh(px[:, 2 * H :] + r * hw[:, 2 * H :])
                nn_ = G[:, 2 * H : 3 * H]
                h[:n] = nn_ + z * (h[:n] - nn_)
                out[rows] = h[:n]
        ctx.steps, ctx.precision, ctx.batch_sizes, ctx.x_is_input = steps, p, batch_sizes, x_c is x
        ctx.bias_dtype = None if b_ih is None else b_ih.dtype
        ctx.save_for_backward(x_c, gates.to(p.compute), h0, w_ih, w_hh, b_ih, b_hh)
        return out, h  # h_n in the state dtype: the carried state is not rounded (precision.py)

    @staticmethod
    def backward(ctx, d_out, d_hn):
        x_c, gates_c, h0, w_ih, w_hh, b_ih, b_hh = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: gradients that can be differentiated again
            inputs = (x_c, ctx.batch_sizes, h0, w_ih, w_hh, b_ih, b_hh, ctx.steps.reverse)
            return differentiable.backward("gru", inputs, ctx.needs_input_grad, (d_out, d_hn), ctx.x_is_input)
        steps, p = ctx.steps, ctx.precision
        H = w_hh.shape[1]
        with autocast_off(x_c.device):
            gates = gates_c.to(p.state)
            _, z_all, n_all, _ = gates.chunk(4, 1)
            # Rebuild h_t for every token with a pointwise scan: h_t = n + z * (h_{t-1} - n).
            h_all = _scan(steps, h0.to(p.state), lambda h, r: n_all[r] + z_all[r] * (h - n_all[r]))
            prev = steps.prev_index(x_c.device)
            h_prev = gather_prev(h0.to(p.state), h_all, prev)

            w_hh_c = w_hh.to(p.compute)
            # (N, 4H): [dr, dz, dn] pre-activation grads (input side) and d(W_hn h + b_hn)
            dG = torch.empty_like(gates)
            dh = d_hn.to(p.state).clone()
            d_out = d_out.to(p.state)
            for t in reversed(steps.order()):
                rows, n = steps.rows(t), steps.batch_sizes[t]
                r, z, nn_, hn = gates[rows].chunk(4, 1)
                dh_t = dh[:n]
                dh_t += d_out[rows]
                D = dG[rows]
                dn = dh_t * (1 - z) * _tanh_grad(nn_)
                D[:, 2 * H : 3 * H] = dn
                D[:, H : 2 * H] = dh_t * (h_prev[rows] - nn_) * _sigmoid_grad(z)
                D[:, :H] = dn * hn * _sigmoid_grad(r)
                D[:, 3 * H :] = dn * r
                D_c = D.to(p.compute)
                dh_new = torch.mm(D_c[:, : 2 * H], w_hh_c[: 2 * H]).to(p.state)
                dh_new += torch.mm(D_c[:, 3 * H :], w_hh_c[2 * H :]).to(p.state)
                dh_new.addcmul_(dh_t, z)
                dh[:n] = dh_new

            dG_c = dG.to(p.compute)
            dGx_c = dG_c[:, : 3 * H]
            need = ctx.needs_input_grad
            dx = torch.mm(dGx_c, w_ih.to(p.compute)).to(x_c.dtype) if need[0] else None
            dw_ih = torch.mm(dGx_c.t(), x_c).to(w_ih.dtype) if need[3] else None
            dw_hh = None
            if need[4]:
                h_prev_c = h_prev.to(p.compute)
                dw_hh = torch.cat(
                    [torch.mm(dG_c[:, : 2 * H].t(), h_prev_c), torch.mm(dG_c[:, 3 * H :].t(), h_prev_c)]
                ).to(w_hh.dtype)
            db_ih = db_hh = None
            if ctx.bias_dtype is not None:
                db_ih = dG[:, : 3 * H].sum(0).to(ctx.bias_dtype)
                db_hh = torch.cat([dG[:, : 2 * H].sum(0), dG[:, 3 * H :].sum(0)]).to(ctx.bias_dtype)
        dh0 = dh.to(h0.dtype) if need[2] else None
        return dx, None, dh0, dw_ih, dw_hh, db_ih, db_hh, None


def lstm(x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, reverse, w_hr=None):
    x = compute_input(x, w_ih)
    return LSTMFunction.apply(x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, reverse, w_hr)


def gru(x, batch_sizes, h0, w_ih, w_hh, b_ih, b_hh, reverse):
    return GRUFunction.apply(compute_input(x, w_ih), batch_sizes, h0, w_ih, w_hh, b_ih, b_hh, reverse)


def _load():
    return None  # plain torch ops: nothing to build


BACKEND = Backend(
    name="reference", devices=None, load=_load, lstm=lstm, gru=gru, functions=(LSTMFunction, GRUFunction)
)
