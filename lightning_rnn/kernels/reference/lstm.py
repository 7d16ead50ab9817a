"""The reference LSTM: one direction of one layer, every cell option, hand-written backward.

Forward, per step: ``pre = LN_ih(x W_ih^T) + LN_hh(hbar W_hh^T) + b`` (the input side for
all tokens in one GEMM before the loop), gates ``i, f, g, o``, ``ctilde = f c + i g``,
``htilde = o * tanh(LN_c(ctilde))`` (projected by ``w_hr`` if given), then zoneout mixes
``c_t``, ``h_t`` with the previous values; ``hbar`` is h with recurrent dropout's mask.
Without an option its lines reduce to the plain cell (the layer-norm ``LN_*`` to identity).

Saved: the input, the activated gates (N, 4H), h0, c0, the weights, the masks (bool) and,
with layer norm, the recurrent GEMM's result ``hbar W_hh^T`` (N, 4H) and the per-row
``[mean, rstd]`` (N, 2) of the recurrent and cell norms. Backward rebuilds ``c_t`` (and,
with zoneout on h, ``h_t``) by pointwise scans and recomputes ``x W_ih^T`` with one GEMM
for the input norm, so nothing else per token is kept.
"""
from __future__ import annotations

import torch

from .. import differentiable
from ..precision import Precision, autocast_off
from ..steps import Steps, gather_prev
from . import ops

#: The Function's inputs after ``w_hr``, in order (see :func:`lightning_rnn.kernels.reference.lstm`).
OPTION_INPUTS = ("norm_ih_weight", "norm_ih_bias", "norm_hh_weight", "norm_hh_bias", "norm_c_weight",
                 "norm_c_bias", "recurrent_keep", "recurrent_p", "zoneout_c", "zoneout_h", "keep_c", "keep_h", "weight_keep", "weight_p")


class LSTMFunction(torch.autograd.Function):
    """One direction of one LSTM layer. Returns ``(out (N, P), h_n (B, P), c_n (B, H))``."""

    @staticmethod
    def forward(ctx, x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, reverse, w_hr=None,
                norm_ih_weight=None, norm_ih_bias=None, norm_hh_weight=None, norm_hh_bias=None,
                norm_c_weight=None, norm_c_bias=None, recurrent_keep=None, recurrent_p=0.0,
                zoneout_c=0.0, zoneout_h=0.0, keep_c=None, keep_h=None, weight_keep=None, weight_p=0.0):
        steps = Steps.from_batch_sizes(batch_sizes, reverse)
        p = Precision.for_call(x, w_ih)
        H, P, N = c0.shape[1], h0.shape[1], steps.num_rows
        norm = norm_ih_weight is not None
        plain = not (norm or zoneout_c or zoneout_h)
        with autocast_off(x.device):
            x_c, w_ih_c = x.to(p.compute), w_ih.to(p.compute)
            w_hh_c = ops.dropped_weight(w_hh, weight_keep, weight_p).to(p.compute)
            w_hr_c = None if w_hr is None else w_hr.to(p.compute)
            bias = None if b_ih is None else (b_ih + b_hh).to(p.state)
            if norm:  # LN_ih(x W_ih^T) + b for all tokens at once
                a_x = ops.project_input(x_c, w_ih_c, None, p.state)
                gates = ops.normalized(a_x, ops.norm_stats(a_x)) * norm_ih_weight + norm_ih_bias
                if bias is not None:
                    gates += bias
                a_h_all = x.new_empty(N, 4 * H, dtype=p.compute)  # hbar W_hh^T, saved
                stats_h, stats_c = x.new_empty(N, 2, dtype=p.state), x.new_empty(N, 2, dtype=p.state)
            else:
                gates = ops.project_input(x_c, w_ih_c, bias, p.state)  # (N, 4H)
                a_h_all = stats_h = stats_c = None
            scale = ops.recurrent_scale(recurrent_keep, recurrent_p, p.state)  # (B, P) or None
            out = x.new_empty(N, P, dtype=p.compute)
            h, c = h0.to(p.state).clone(), c0.to(p.state).clone()  # (B, P), (B, H)
            for t in steps.order():
                rows, n = steps.rows(t), steps.batch_sizes[t]
                g = gates[rows]  # (n, 4H)
                h_in = h[:n] if scale is None else h[:n] * scale[:n]
                if norm:
                    a_h = torch.mm(h_in.to(p.compute), w_hh_c.t())
                    a_h_all[rows] = a_h
                    a_h = a_h.to(p.state)
                    stats_h[rows] = s = ops.norm_stats(a_h)
                    g += ops.normalized(a_h, s) * norm_hh_weight + norm_hh_bias
                else:
                    ops.addmm_(g, h_in.to(p.compute), w_hh_c.t())
                g[:, : 2 * H].sigmoid_()
                g[:, 2 * H : 3 * H].tanh_()
                g[:, 3 * H :].sigmoid_()
                i, f, gg, o = g.chunk(4, 1)
                if plain:
                    c[:n].mul_(f).addcmul_(i, gg)
                    h[:n] = _project(o * c[:n].tanh(), w_hr_c, p)
                else:
                    c_new = f * c[:n] + i * gg  # ctilde
                    y = c_new
                    if norm:
                        stats_c[rows] = s = ops.norm_stats(c_new)
                        y = ops.normalized(c_new, s) * norm_c_weight + norm_c_bias
                    h_new = _project(o * y.tanh(), w_hr_c, p)
                    c[:n] = ops.zoneout(c[:n], c_new, zoneout_c, ops.rows_of(keep_c, rows)) if zoneout_c else c_new
                    h[:n] = ops.zoneout(h[:n], h_new, zoneout_h, ops.rows_of(keep_h, rows)) if zoneout_h else h_new
                out[rows] = h[:n]
        ctx.steps, ctx.precision, ctx.batch_sizes, ctx.x_is_input = steps, p, batch_sizes, x_c is x
        ctx.bias_dtype = None if b_ih is None else b_ih.dtype
        ctx.options = (recurrent_p, zoneout_c, zoneout_h, weight_p)
        ctx.save_for_backward(x_c, gates.to(p.compute), h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, norm_ih_weight,
                              norm_ih_bias, norm_hh_weight, norm_hh_bias, norm_c_weight, norm_c_bias, a_h_all,
                              stats_h, stats_c, recurrent_keep, keep_c, keep_h, weight_keep)
        # h_n is a GEMM operand only (the compute dtype loses nothing), unless zoneout mixes it
        return out, h if zoneout_h else h.to(p.compute), c

    @staticmethod
    def backward(ctx, d_out, d_hn, d_cn):
        (x_c, gates_c, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, n_ih_w, n_ih_b, n_hh_w, n_hh_b, n_c_w, n_c_b,
         a_h_all, stats_h, stats_c, rec_keep, keep_c, keep_h, weight_keep) = ctx.saved_tensors
        rec_p, zoneout_c, zoneout_h, weight_p = ctx.options
        if torch.is_grad_enabled():  # create_graph=True: gradients that can be differentiated again
            inputs = (x_c, ctx.batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, ctx.steps.reverse, w_hr, n_ih_w, n_ih_b,
                      n_hh_w, n_hh_b, n_c_w, n_c_b, rec_keep, rec_p, zoneout_c, zoneout_h, keep_c, keep_h,
                      weight_keep, weight_p)
            grads = (d_out, d_hn, d_cn)
            return differentiable.backward("lstm", inputs, ctx.needs_input_grad, grads, ctx.x_is_input)
        steps, p = ctx.steps, ctx.precision
        H = c0.shape[1]
        norm = n_ih_w is not None
        plain = not (norm or zoneout_c or zoneout_h)
        with autocast_off(x_c.device):
            gates = gates_c.to(p.state)
            i_all, f_all, g_all, o_all = gates.chunk(4, 1)
            prev = steps.prev_index(x_c.device)
            c0_s = c0.to(p.state)
            # Rebuild the cell state by a pointwise scan: ctilde = f * c_{t-1} + i * g, then zoneout.
            if zoneout_c:
                c_all, c_tilde = ops.zoneout_scan(steps, c0_s, lambda c, r: f_all[r] * c + i_all[r] * g_all[r],
                                               zoneout_c, keep_c)
            else:
                c_all = c_tilde = ops.scan(steps, c0_s, lambda c, r: f_all[r] * c + i_all[r] * g_all[r])
            c_prev = gather_prev(c0_s, c_all, prev)
            c_hat = ops.normalized(c_tilde, stats_c) if norm else None
            y_all = c_hat * n_c_w + n_c_b if norm else c_tilde
            tanh_y = y_all.tanh()

            w_hh_c = ops.dropped_weight(w_hh, weight_keep, weight_p).to(p.compute)
            w_hr_c = None if w_hr is None else w_hr.to(p.compute)
            scale = ops.recurrent_scale(rec_keep, rec_p, p.state)
            dG = torch.empty_like(gates)  # (N, 4H) gradients of the gate pre-activations
            dA = torch.empty_like(gates) if norm else dG  # (N, 4H) ... of hbar W_hh^T
            dH = None if w_hr is None else d_out.new_empty(d_out.shape, dtype=p.state)  # (N, P) dL/dhtilde
            d_norm = [[torch.zeros_like(w, dtype=p.state) for _ in 'wb'] for w in (n_hh_w, n_c_w)] if norm else None
            dh, dc = d_hn.to(p.state).clone(), d_cn.to(p.state).clone()
            d_out = d_out.to(p.state)
            for t in reversed(steps.order()):
                rows, n = steps.rows(t), steps.batch_sizes[t]
                i, f, g, o = gates[rows].chunk(4, 1)
                dh_t, dc_t, ty = dh[:n], dc[:n], tanh_y[rows]
                dh_t += d_out[rows]
                if zoneout_h:  # h_t = zoneout(h_{t-1}, htilde): dh_t splits
                    dh_kept, dh_t = ops.zoneout_grads(dh_t, zoneout_h, ops.rows_of(keep_h, rows))
                if w_hr is not None:  # back through htilde = r W_hr^T to r = o * tanh(y)
                    dH[rows] = dh_t
                    dh_t = torch.mm(dh_t.to(p.compute), w_hr_c).to(p.state)
                D = dG[rows]
                if plain:
                    dc_t += dh_t * o * ops.tanh_grad(ty)
                    d_tilde = dc_t
                else:
                    dy = dh_t * o * ops.tanh_grad(ty)
                    if norm:
                        c_hat_t = c_hat[rows]
                        d_norm[1][0] += (dy * c_hat_t).sum(0)
                        d_norm[1][1] += dy.sum(0)
                        dy = ops.norm_backward(dy, c_hat_t, stats_c[rows], n_c_w)
                    if zoneout_c:  # c_t = zoneout(c_{t-1}, ctilde)
                        dc_kept, d_tilde = ops.zoneout_grads(dc_t, zoneout_c, ops.rows_of(keep_c, rows))
                        d_tilde = d_tilde + dy
                    else:
                        d_tilde = dc_t + dy
                D[:, :H] = d_tilde * g * ops.sigmoid_grad(i)
                D[:, H : 2 * H] = d_tilde * c_prev[rows] * ops.sigmoid_grad(f)
                D[:, 2 * H : 3 * H] = d_tilde * i * ops.tanh_grad(g)
                D[:, 3 * H :] = dh_t * ty * ops.sigmoid_grad(o)
                if plain:
                    dc_t.mul_(f)
                else:
                    dc[:n] = d_tilde * f + dc_kept if zoneout_c else d_tilde * f
                if norm:  # back through LN_hh to hbar W_hh^T
                    a_hat = ops.normalized(a_h_all[rows].to(p.state), stats_h[rows])
                    d_norm[0][0] += (D * a_hat).sum(0)
                    d_norm[0][1] += D.sum(0)
                    dA[rows] = ops.norm_backward(D, a_hat, stats_h[rows], n_hh_w)
                dh_prev = torch.mm(dA[rows].to(p.compute), w_hh_c).to(p.state)
                if scale is not None:
                    dh_prev *= scale[:n]
                if zoneout_h:
                    dh_prev += dh_kept
                dh[:n] = dh_prev

            need = ctx.needs_input_grad
            w_ih_c = w_ih.to(p.compute)
            dA_x, d_norm_ih = ops.input_norm_backward(dG, x_c, w_ih_c, n_ih_w, p) if norm else (dG, None)
            dA_x_c = dA_x.to(p.compute)
            dx = torch.mm(dA_x_c, w_ih_c).to(x_c.dtype) if need[0] else None
            dw_ih = torch.mm(dA_x_c.t(), x_c).to(w_ih.dtype) if need[4] else None
            r_all = o_all * tanh_y  # (N, H): the cell's output before any projection
            dw_hh = dw_hr = None
            if need[5]:
                h_tilde = _project(r_all, w_hr_c, p)
                h_all = ops.zoneout_scan(steps, h0.to(p.state), lambda h, r: h_tilde[r], zoneout_h, keep_h)[0] \
                    if zoneout_h else h_tilde
                h_prev = gather_prev(h0.to(p.state), h_all, prev)
                if scale is not None:
                    h_prev = h_prev * scale.index_select(0, steps.sequence_index(x_c.device))
                dw_hh = ops.dropped_weight(torch.mm(dA.to(p.compute).t(), h_prev.to(p.compute)), weight_keep,
                                           weight_p).to(w_hh.dtype)
            if w_hr is not None and need[9]:
                dw_hr = torch.mm(dH.to(p.compute).t(), r_all.to(p.compute)).to(w_hr.dtype)
            db = dG.sum(0).to(ctx.bias_dtype) if ctx.bias_dtype is not None else None
        dh0 = dh.to(h0.dtype) if need[2] else None
        dc0 = dc.to(c0.dtype) if need[3] else None
        norms = (None,) * 6
        if norm:
            (dw_nih, db_nih), (dw_nhh, db_nhh), (dw_nc, db_nc) = d_norm_ih, *d_norm
            norms = tuple(d.to(w.dtype) for d, w in zip((dw_nih, db_nih, dw_nhh, db_nhh, dw_nc, db_nc),
                                                       (n_ih_w, n_ih_b, n_hh_w, n_hh_b, n_c_w, n_c_b)))
        return (dx, None, dh0, dc0, dw_ih, dw_hh, db, db, None, dw_hr, *norms) + (None,) * 8


def _project(r: torch.Tensor, w_hr_c: torch.Tensor | None, p: Precision) -> torch.Tensor:
    """h = r W_hr^T (GEMM in the compute dtype, result in the state dtype); r itself without a projection."""
    return r if w_hr_c is None else torch.mm(r.to(p.compute), w_hr_c.t()).to(p.state)
