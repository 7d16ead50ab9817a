"""The reference GRU: one direction of one layer, every cell option, hand-written backward.

torch/cuDNN's GRU math, ``r`` gating ``W_hn h + b_hn``: per step ``ax = LN_ih(x W_ih^T)``
(the input side for all tokens in one GEMM before the loop), ``ah = LN_hh(hbar W_hh^T)``,
``r = sigma(ax_r + ah_r + b_r)``, ``z = sigma(ax_z + ah_z + b_z)``,
``n = tanh(ax_n + b_in + r * (ah_n + b_hn))``, ``htilde = n + z * (h_{t-1} - n)``, then
zoneout mixes ``h_t`` with ``h_{t-1}``; ``hbar`` is h with recurrent dropout's mask. Without
an option its lines reduce to the plain cell (``LN_*`` to identity).

Saved: the input, the gates (N, 4H) ``[r, z, n, ah_n + b_hn]``, h0, the weights, the masks
(bool) and, with layer norm, the recurrent GEMM's result (N, 3H) and its norm's per-row
``[mean, rstd]`` (N, 2); ``x W_ih^T`` is recomputed in backward for the input norm.
"""
from __future__ import annotations

import torch

from .. import differentiable
from ..precision import Precision, autocast_off
from ..steps import Steps, gather_prev
from . import ops

#: The Function's inputs after ``reverse``, in order (see :func:`lightning_rnn.kernels.reference.gru`).
OPTION_INPUTS = ("norm_ih_weight", "norm_ih_bias", "norm_hh_weight", "norm_hh_bias", "recurrent_keep",
                 "recurrent_p", "zoneout_h", "keep_h", "weight_keep", "weight_p")


class GRUFunction(torch.autograd.Function):
    """One direction of one GRU layer. Returns ``(out (N, H), h_n (B, H))``."""

    @staticmethod
    def forward(ctx, x, batch_sizes, h0, w_ih, w_hh, b_ih, b_hh, reverse, norm_ih_weight=None, norm_ih_bias=None,
                norm_hh_weight=None, norm_hh_bias=None, recurrent_keep=None, recurrent_p=0.0, zoneout_h=0.0,
                keep_h=None, weight_keep=None, weight_p=0.0):
        steps = Steps.from_batch_sizes(batch_sizes, reverse)
        p = Precision.for_call(x, w_ih)
        H, N = w_hh.shape[0] // 3, steps.num_rows
        norm = norm_ih_weight is not None
        with autocast_off(x.device):
            x_c, w_ih_c = x.to(p.compute), w_ih.to(p.compute)
            w_hh_c = ops.dropped_weight(w_hh, weight_keep, weight_p).to(p.compute)
            bias, b_hn = None, None
            if b_ih is not None:  # b_hr, b_hz fold into the input side; b_hn cannot (r multiplies it)
                bias = (b_ih + torch.cat([b_hh[: 2 * H], torch.zeros_like(b_hh[2 * H :])])).to(p.state)
                b_hn = b_hh[2 * H :].to(p.state)
            if norm:  # LN_ih(x W_ih^T) + b for all tokens at once
                a_x = ops.project_input(x_c, w_ih_c, None, p.state)
                pre_x = ops.normalized(a_x, ops.norm_stats(a_x)) * norm_ih_weight + norm_ih_bias
                if bias is not None:
                    pre_x += bias
                a_h_all, stats_h = x.new_empty(N, 3 * H, dtype=p.compute), x.new_empty(N, 2, dtype=p.state)
            else:
                pre_x = ops.project_input(x_c, w_ih_c, bias, p.state)  # (N, 3H)
                a_h_all = stats_h = None
            scale = ops.recurrent_scale(recurrent_keep, recurrent_p, p.state)
            gates = pre_x.new_empty(N, 4 * H)  # [r, z, n, hn]
            out = x.new_empty(N, H, dtype=p.compute)
            h = h0.to(p.state).clone()  # (B, H)
            for t in steps.order():
                rows, n = steps.rows(t), steps.batch_sizes[t]
                h_in = h[:n] if scale is None else h[:n] * scale[:n]
                hw = torch.mm(h_in.to(p.compute), w_hh_c.t())  # (n, 3H)
                if norm:
                    a_h_all[rows] = hw
                    hw = hw.to(p.state)
                    stats_h[rows] = s = ops.norm_stats(hw)
                    hw = ops.normalized(hw, s) * norm_hh_weight + norm_hh_bias
                else:
                    hw = hw.to(p.state)
                if b_hn is not None:
                    hw[:, 2 * H :] += b_hn
                px, G = pre_x[rows], gates[rows]
                torch.sigmoid(px[:, : 2 * H] + hw[:, : 2 * H], out=G[:, : 2 * H])
                r, z = G[:, :H], G[:, H : 2 * H]
                G[:, 3 * H :] = hw[:, 2 * H :]
                G[:, 2 * H : 3 * H] = torch.tanh(px[:, 2 * H :] + r * hw[:, 2 * H :])
                nn_ = G[:, 2 * H : 3 * H]
                h_new = nn_ + z * (h[:n] - nn_)
                h[:n] = ops.zoneout(h[:n], h_new, zoneout_h, ops.rows_of(keep_h, rows)) if zoneout_h else h_new
                out[rows] = h[:n]
        ctx.steps, ctx.precision, ctx.batch_sizes, ctx.x_is_input = steps, p, batch_sizes, x_c is x
        ctx.bias_dtype = None if b_ih is None else b_ih.dtype
        ctx.options = (recurrent_p, zoneout_h, weight_p)
        ctx.save_for_backward(x_c, gates.to(p.compute), h0, w_ih, w_hh, b_ih, b_hh, norm_ih_weight, norm_ih_bias,
                              norm_hh_weight, norm_hh_bias, a_h_all, stats_h, recurrent_keep, keep_h, weight_keep)
        return out, h  # h_n in the state dtype: the carried state is not rounded (precision.py)

    @staticmethod
    def backward(ctx, d_out, d_hn):
        (x_c, gates_c, h0, w_ih, w_hh, b_ih, b_hh, n_ih_w, n_ih_b, n_hh_w, n_hh_b, a_h_all, stats_h, rec_keep,
         keep_h, weight_keep) = ctx.saved_tensors
        rec_p, zoneout_h, weight_p = ctx.options
        if torch.is_grad_enabled():  # create_graph=True: gradients that can be differentiated again
            inputs = (x_c, ctx.batch_sizes, h0, w_ih, w_hh, b_ih, b_hh, ctx.steps.reverse, n_ih_w, n_ih_b, n_hh_w,
                      n_hh_b, rec_keep, rec_p, zoneout_h, keep_h, weight_keep, weight_p)
            return differentiable.backward("gru", inputs, ctx.needs_input_grad, (d_out, d_hn), ctx.x_is_input)
        steps, p = ctx.steps, ctx.precision
        H = w_hh.shape[0] // 3
        norm = n_ih_w is not None
        with autocast_off(x_c.device):
            gates = gates_c.to(p.state)
            _, z_all, n_all, _ = gates.chunk(4, 1)
            # Rebuild h_t for every token with a pointwise scan: htilde = n + z * (h_{t-1} - n), then zoneout.
            step = lambda h, r: n_all[r] + z_all[r] * (h - n_all[r])  # noqa: E731
            if zoneout_h:
                h_all = ops.zoneout_scan(steps, h0.to(p.state), step, zoneout_h, keep_h)[0]
            else:
                h_all = ops.scan(steps, h0.to(p.state), step)
            prev = steps.prev_index(x_c.device)
            h_prev = gather_prev(h0.to(p.state), h_all, prev)

            w_hh_c = ops.dropped_weight(w_hh, weight_keep, weight_p).to(p.compute)
            scale = ops.recurrent_scale(rec_keep, rec_p, p.state)
            # (N, 4H): [dr, dz, dn] pre-activation grads (input side) and d(ah_n + b_hn)
            dG = torch.empty_like(gates)
            dA = gates.new_empty(steps.num_rows, 3 * H) if norm else None  # (N, 3H) d(hbar W_hh^T)
            d_norm_hh = [torch.zeros_like(n_hh_w, dtype=p.state) for _ in "wb"] if norm else None
            dh = d_hn.to(p.state).clone()
            d_out = d_out.to(p.state)
            for t in reversed(steps.order()):
                rows, n = steps.rows(t), steps.batch_sizes[t]
                r, z, nn_, hn = gates[rows].chunk(4, 1)
                dh_t = dh[:n]
                dh_t += d_out[rows]
                if zoneout_h:  # h_t = zoneout(h_{t-1}, htilde): dh_t splits
                    dh_kept, dh_t = ops.zoneout_grads(dh_t, zoneout_h, ops.rows_of(keep_h, rows))
                D = dG[rows]
                dn = dh_t * (1 - z) * ops.tanh_grad(nn_)
                D[:, 2 * H : 3 * H] = dn
                D[:, H : 2 * H] = dh_t * (h_prev[rows] - nn_) * ops.sigmoid_grad(z)
                D[:, :H] = dn * hn * ops.sigmoid_grad(r)
                D[:, 3 * H :] = dn * r
                if norm:  # back through LN_hh to hbar W_hh^T: its gradient is [dr, dz, d(ah_n)]
                    d_ah = torch.cat([D[:, : 2 * H], D[:, 3 * H :]], dim=1)
                    a_hat = ops.normalized(a_h_all[rows].to(p.state), stats_h[rows])
                    d_norm_hh[0] += (d_ah * a_hat).sum(0)
                    d_norm_hh[1] += d_ah.sum(0)
                    dA[rows] = d_a = ops.norm_backward(d_ah, a_hat, stats_h[rows], n_hh_w)
                    dh_new = torch.mm(d_a.to(p.compute), w_hh_c).to(p.state)
                else:
                    D_c = D.to(p.compute)
                    dh_new = torch.mm(D_c[:, : 2 * H], w_hh_c[: 2 * H]).to(p.state)
                    dh_new += torch.mm(D_c[:, 3 * H :], w_hh_c[2 * H :]).to(p.state)
                if scale is not None:
                    dh_new *= scale[:n]
                dh_new.addcmul_(dh_t, z)
                if zoneout_h:
                    dh_new += dh_kept
                dh[:n] = dh_new

            need = ctx.needs_input_grad
            w_ih_c = w_ih.to(p.compute)
            dA_x, d_norm_ih = ops.input_norm_backward(dG, x_c, w_ih_c, n_ih_w, p) if norm else (dG[:, : 3 * H], None)
            dA_x_c = dA_x.to(p.compute)
            dx = torch.mm(dA_x_c, w_ih_c).to(x_c.dtype) if need[0] else None
            dw_ih = torch.mm(dA_x_c.t(), x_c).to(w_ih.dtype) if need[3] else None
            dw_hh = None
            if need[4]:
                if scale is not None:
                    h_prev = h_prev * scale.index_select(0, steps.sequence_index(x_c.device))
                h_prev_c = h_prev.to(p.compute)
                if norm:
                    dw_hh = torch.mm(dA.to(p.compute).t(), h_prev_c)
                else:
                    dG_c = dG.to(p.compute)
                    dw_hh = torch.cat(
                        [torch.mm(dG_c[:, : 2 * H].t(), h_prev_c), torch.mm(dG_c[:, 3 * H :].t(), h_prev_c)]
                    )
                dw_hh = ops.dropped_weight(dw_hh, weight_keep, weight_p).to(w_hh.dtype)
            db_ih = db_hh = None
            if ctx.bias_dtype is not None:
                db_ih = dG[:, : 3 * H].sum(0).to(ctx.bias_dtype)
                db_hh = torch.cat([dG[:, : 2 * H].sum(0), dG[:, 3 * H :].sum(0)]).to(ctx.bias_dtype)
        dh0 = dh.to(h0.dtype) if need[2] else None
        norms = (None,) * 4
        if norm:
            norms = tuple(d.to(w.dtype) for d, w in zip((*d_norm_ih, *d_norm_hh), (n_ih_w, n_ih_b, n_hh_w, n_hh_b)))
        return (dx, None, dh0, dw_ih, dw_hh, db_ih, db_hh, None, *norms) + (None,) * 6
