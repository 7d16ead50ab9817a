// The per-row math of the cell options (layer norm, zoneout, recurrent dropout) for one
// step of one layer-direction, shared by the CPU and CUDA backends; the driver that runs
// it is rnn_driver_options.h, the specification kernels/reference/{lstm,gru}.py.
//
// A row is one sequence of a step (b < n). Options need whole-row reductions (a layer
// norm's mean and variance), so each function here takes the row as a whole, through a
// row loop (rnn_rows.h: its passes and helpers); a row is a few simple passes over
// scratch rows rather than one pass with conditions. S = compute dtype (GEMM operands,
// saved gates, outputs), A = state dtype. The backward's scans: rnn_options_scan.h.
#pragma once

#include <cmath>
#include <cstdint>

#include "rnn_rows.h"

namespace lrnn {

// ---- forward ------------------------------------------------------------------------
template <typename S, typename A>
struct OptFwdRow {
  const A* pre;      // (G*H) the input side: x W_ih^T, layer-normalized with layer norm
  const S* hw;       // (G*H) hbar W_hh^T (saved as is with layer norm)
  const A* bias;     // (G*H) folded bias (zeros without one)
  const A* b_hn;     // (H) GRU
  const A* norm_hw;  // (G*H) recurrent norm's gain, null without layer norm
  const A* norm_hb;  // (G*H) ... bias
  const A* norm_cw;  // (H) LSTM cell norm's gain
  const A* norm_cb;  // (H) ... bias
  A* stats_h;        // (2) recurrent norm's [mean, rstd] of this token
  A* stats_c;        // (2) cell norm's
  S* gates;          // (4H) saved gates
  A* c;              // (H) LSTM cell state
  A* h;              // (P) the state h in the state dtype
  A* ctil;           // (H) scratch: ctilde
  A* htil;           // (H) scratch: htilde before any projection
  S* h_c;            // (P) next step's GEMM input: h * rscale
  S* out;            // (P) output; with a projection (H) r = o * tanh(y), which the driver projects
  const A* rscale;   // (P) recurrent dropout's keep / (1 - p), null without it
  const uint8_t* keep_c;  // (H) zoneout masks of this token, null in evaluation
  const uint8_t* keep_h;  // (P)
};

template <typename S, typename A>
struct OptFwdStep {  // one time step, rows [0, n)
  const A* pre; const S* hw; const A* bias; const A* b_hn;
  const A* norm_hw; const A* norm_hb; const A* norm_cw; const A* norm_cb;
  A* stats_h; A* stats_c; S* gates; A* c; A* h; A* ctil; A* htil; S* h_c; S* out;
  const A* rscale; const uint8_t* keep_c; const uint8_t* keep_h;
  A p_c, p_h;
  bool project;
  int64_t n, H, P, G;
  RNN_HD OptFwdRow<S, A> row(int64_t b) const {
    const int64_t GH = G * H, OUT = project ? H : P;
    return {pre + b * GH, hw + b * GH, bias, b_hn, norm_hw, norm_hb, norm_cw, norm_cb,
            stats_h ? stats_h + 2 * b : nullptr, stats_c ? stats_c + 2 * b : nullptr, gates + b * 4 * H,
            c ? c + b * H : nullptr, h + b * P, ctil ? ctil + b * H : nullptr, htil + b * H, h_c + b * P,
            out + b * OUT, rscale ? rscale + b * P : nullptr, keep_c ? keep_c + b * H : nullptr,
            keep_h ? keep_h + b * P : nullptr};
  }
};

// The recurrent side of the row's G*H gate columns: hw itself, or LN_hh(hw) with its
// [mean, rstd] written to stats_h; calls gates(rec) with rec(k) the side's column k.
template <class L, typename S, typename A, class Gates>
RNN_HD void with_recurrent_side(const L& loop, const OptFwdRow<S, A>& r, int64_t G, Gates gates) {
  if (r.norm_hw) {
    row_stats(loop, G, [&](int64_t k) RNN_ROW_LAMBDA { return r.hw[k]; }, r.stats_h);
    const A mean = r.stats_h[0], rstd = r.stats_h[1];
    gates([&](int64_t k) RNN_ROW_LAMBDA -> A { return (A(r.hw[k]) - mean) * rstd * r.norm_hw[k] + r.norm_hb[k]; });
  } else {
    gates([&](int64_t k) RNN_ROW_LAMBDA -> A { return A(r.hw[k]); });
  }
}

// ---- the backward's scan (forward order, per sequence) ----------------------------------
template <typename S, typename A>
struct OptScanArgs {
  const S* gates;         // (N, 4H)
  const A* h0;            // (B, P)
  const A* c0;            // (B, H) LSTM
  const A* stats_c;       // (N, 2) LSTM cell norm, null without layer norm
  const A* norm_cw; const A* norm_cb;
  const A* rscale;        // (B, P) or null
  const uint8_t* keep_c;  // (N, H) or null
  const uint8_t* keep_h;  // (N, P) or null
  A p_c, p_h;
  A* states;              // (N, H) LSTM: c_t;  GRU: h_{t-1}
  S* h_prev_c;            // (N, P) hbar_{t-1} = h_{t-1} * rscale: dW_hh's rows (unless projected)
  S* r;                   // (N, H) LSTM with a projection: r_t = o * tanh(y_t), for the driver
  A* carry;               // (B, P) scratch: h of the token before
  A* scratch;             // (B, H) scratch: ctilde, htilde
  const int64_t* sizes; const int64_t* offsets;
  int64_t T, H, P;
  bool reverse, project;
};

// ---- backward step ----------------------------------------------------------------------
template <typename S, typename A>
struct OptBwdRow {
  const S* gates;        // (4H)
  const A* prev;         // (H) LSTM: c_{t-1};  GRU: h_{t-1} (the scan's states)
  const A* stats_c;      // (2) LSTM cell norm
  const A* stats_h;      // (2) recurrent norm
  const S* a_h;          // (G*H) hbar W_hh^T saved
  const A* norm_hw; const A* norm_cw; const A* norm_cb;
  const S* d_out;        // (P) output gradient; with a projection (H) dr = dhtilde W_hr
  const S* dh_in;        // (P) the previous backward step's dH W_hh (null: none for this row)
  const A* rscale;       // (P) or null
  const uint8_t* keep_c; const uint8_t* keep_h;
  A* dh;                 // (P) carried dh (d h_n at first); with a projection unused (the driver's)
  A* dc;                 // (H) LSTM carried dc
  A* dG;                 // (4H) gate pre-activation gradients (GRU: [dr, dz, dhn, dn])
  S* dH;                 // (HG) the recurrent side's gradient: dW_hh's rows and next step's GEMM input
                         //      (null: dG's first HG columns are it, as they are without layer norm
                         //      in one precision)
  A* dy;                 // (H) LSTM scratch: d(LN_c output)
  A* chat;               // (H) LSTM scratch: the normalized ctilde
  A* d;                  // (max(H, P)) scratch: the gradient of htilde / ctilde
  // Running sums of this batch row's parameter gradients (the driver adds them up): the
  // biases' (4H: dG itself), the recurrent norm's gain (HG) and the cell norm's gain and
  // bias (H); the norms' other terms are the biases' (the same sums). Null where absent.
  A* db; A* dgh; A* dgc; A* dbc;
};

template <typename S, typename A>
struct OptBwdStep {  // one time step, rows [0, n)
  const S* gates; const A* prev; const A* c0; int64_t m_prev;  // prev rows valid for b < m_prev, else c0
  const A* stats_c; const A* stats_h; const S* a_h;
  const A* norm_hw; const A* norm_cw; const A* norm_cb;
  const S* d_out; const S* dh_in; int64_t m_in;  // dh_in valid for b < m_in
  const A* rscale; const uint8_t* keep_c; const uint8_t* keep_h;
  A p_c, p_h;
  A* dh; A* dc; A* dG; S* dH; A* dy; A* chat; A* d;
  A* db; A* dgh; A* dgc; A* dbc;
  bool project;
  int64_t n, H, P, G, HG;
  RNN_HD OptBwdRow<S, A> row(int64_t b) const {
    const int64_t DO = project ? H : P, W = H > P ? H : P;
    return {gates + b * 4 * H, b < m_prev ? prev + b * H : c0 + b * H,
            stats_c ? stats_c + 2 * b : nullptr, stats_h ? stats_h + 2 * b : nullptr,
            a_h ? a_h + b * G * H : nullptr, norm_hw, norm_cw, norm_cb, d_out + b * DO,
            dh_in && b < m_in ? dh_in + b * P : nullptr, rscale ? rscale + b * P : nullptr,
            keep_c ? keep_c + b * H : nullptr, keep_h ? keep_h + b * P : nullptr, dh ? dh + b * P : nullptr,
            dc ? dc + b * H : nullptr, dG + b * 4 * H, dH ? dH + b * HG : nullptr, dy ? dy + b * H : nullptr,
            chat ? chat + b * H : nullptr, d + b * W, db + b * 4 * H, dgh ? dgh + b * HG : nullptr,
            dgc ? dgc + b * H : nullptr, dbc ? dbc + b * H : nullptr};
  }
};

// The recurrent norm's backward over the HG columns of the row's dG that feed W_hh
// (dG columns k < HG in both cells' layouts): dH = rstd * (w dG - mean(w dG) - a_hat
// mean(w dG a_hat)), and its gain's gradient dG a_hat summed; without layer norm dH = dG.
template <class L, typename S, typename A>
RNN_HD void recurrent_norm_backward(const L& loop, const OptBwdRow<S, A>& r, int64_t HG) {
  if (!r.norm_hw) {
    loop.each(HG, [&](int64_t k) RNN_ROW_LAMBDA { r.dH[k] = S(r.dG[k]); });
    return;
  }
  const A mean = r.stats_h[0], rstd = r.stats_h[1];
  const auto a_hat = [&](int64_t k) RNN_ROW_LAMBDA { return (A(r.a_h[k]) - mean) * rstd; };
  A s1, s2;
  loop.template sum2<A>(HG, [&](int64_t k) RNN_ROW_LAMBDA { return r.dG[k] * r.norm_hw[k]; },
                        [&](int64_t k) RNN_ROW_LAMBDA { return r.dG[k] * r.norm_hw[k] * a_hat(k); }, s1, s2);
  s1 /= A(HG);
  s2 /= A(HG);
  loop.each(HG, [&](int64_t k) RNN_ROW_LAMBDA {
    const A ah = a_hat(k);
    r.dH[k] = S(rstd * (r.dG[k] * r.norm_hw[k] - s1 - ah * s2));
    r.dgh[k] += r.dG[k] * ah;
  });
}

// htilde's value v(j) into where it goes: the projection's input r (out), the scratch
// htil (zoneout on h follows), or straight into h, the output and the next GEMM's input.
template <class L, typename S, typename A, class V>
RNN_HD void store_htilde(const L& loop, const OptFwdRow<S, A>& r, int64_t n, bool project, A p_h, V v) {
  if (project) {
    loop.each(n, [&](int64_t j) RNN_ROW_LAMBDA { r.out[j] = S(v(j)); });
  } else if (p_h != A(0)) {
    loop.each(n, [&](int64_t j) RNN_ROW_LAMBDA { r.htil[j] = v(j); });
  } else if (r.rscale) {
    loop.each(n, [&](int64_t j) RNN_ROW_LAMBDA {
      const A h = v(j);
      r.h[j] = h;
      r.out[j] = S(h);
      r.h_c[j] = S(h * r.rscale[j]);
    });
  } else {
    loop.each(n, [&](int64_t j) RNN_ROW_LAMBDA {
      const A h = v(j);
      r.h[j] = h;
      r.out[j] = r.h_c[j] = S(h);
    });
  }
}

// dh_t = carry + dh_in * rscale + d_out into d, and zoneout's kept share of it into the
// carry dh (zero without zoneout on h), over n columns.
template <class L, typename S, typename A>
RNN_HD void hidden_grad(const L& loop, A* d, A* dh, const S* dh_in, const A* rscale, const S* d_out,
                        const uint8_t* keep_h, A p_h, int64_t n) {
  if (p_h == A(0) && dh_in && !rscale) {  // the common case in one pass
    loop.each(n, [&](int64_t j) RNN_ROW_LAMBDA {
      d[j] = dh[j] + A(dh_in[j]) + A(d_out[j]);
      dh[j] = A(0);
    });
    return;
  }
  if (dh_in && !rscale) {  // zoneout on h: the sum and its split in one pass
    with_zoneout_mode(keep_h, p_h, [&](auto mode) RNN_ROW_LAMBDA {
      loop.each(n, [&](int64_t j) RNN_ROW_LAMBDA {
        const A v = dh[j] + A(dh_in[j]) + A(d_out[j]);
        const A kept = zoneout_kept_share<decltype(mode)::value>(v, keep_h, j, p_h);
        d[j] = v - kept;
        dh[j] = kept;
      });
    });
    return;
  }
  total_grad(loop, d, dh, dh_in, rscale, d_out, n);
  zoneout_split(loop, d, dh, keep_h, p_h, n);
}

struct LstmOptions {
  // The forward of one row without the cell norm, a projection or recurrent dropout, in
  // one pass: the gates, ctilde, htilde = o * tanh(ctilde), zoneout on c and on h, and h
  // into the state, the output and the next GEMM's input (the passes below, fused).
  template <class L, typename S, typename A>
  RNN_HD static void zoneout_forward(const L& loop, const OptFwdRow<S, A>& r, int64_t H, A p_c, A p_h) {
    with_recurrent_side(loop, r, 4 * H, [&](auto rec) RNN_ROW_LAMBDA {
      with_zoneout_mode(r.keep_c, p_c, [&](auto mc) RNN_ROW_LAMBDA {
        with_zoneout_mode(r.keep_h, p_h, [&](auto mh) RNN_ROW_LAMBDA {
          loop.each(H, [&](int64_t j) RNN_ROW_LAMBDA {
            const A i = sigmoid(r.pre[j] + rec(j) + r.bias[j]);
            const A f = sigmoid(r.pre[H + j] + rec(H + j) + r.bias[H + j]);
            const A g = tanh_act(r.pre[2 * H + j] + rec(2 * H + j) + r.bias[2 * H + j]);
            const A o = sigmoid(r.pre[3 * H + j] + rec(3 * H + j) + r.bias[3 * H + j]);
            r.gates[j] = S(i);
            r.gates[H + j] = S(f);
            r.gates[2 * H + j] = S(g);
            r.gates[3 * H + j] = S(o);
            const A c_prev = r.c[j];
            const A ct = f * c_prev + i * g;
            const A ht = o * tanh_act(ct);
            r.c[j] = zoneout_mix<decltype(mc)::value>(c_prev, ct, r.keep_c, j, p_c);
            const A h = zoneout_mix<decltype(mh)::value>(r.h[j], ht, r.keep_h, j, p_h);
            r.h[j] = h;
            r.out[j] = r.h_c[j] = S(h);
          });
        });
      });
    });
  }

  // Forward of one row: gates, ctilde, the cell norm, zoneout, the outputs (see OptFwdRow).
  template <class L, typename S, typename A>
  RNN_HD static void forward(const L& loop, const OptFwdRow<S, A>& r, int64_t H, int64_t P, A p_c, A p_h,
                             bool project) {
    if (!r.norm_cw && !project && !r.rscale) {  // zoneout alone: one pass, P == H
      zoneout_forward(loop, r, H, p_c, p_h);
      return;
    }
    A* ct = p_c == A(0) ? r.c : r.ctil;  // ctilde, which is c_t itself without zoneout on c
    with_recurrent_side(loop, r, 4 * H, [&](auto rec) RNN_ROW_LAMBDA {
      loop.each(H, [&](int64_t j) RNN_ROW_LAMBDA {
        const A i = sigmoid(r.pre[j] + rec(j) + r.bias[j]);
        const A f = sigmoid(r.pre[H + j] + rec(H + j) + r.bias[H + j]);
        const A g = tanh_act(r.pre[2 * H + j] + rec(2 * H + j) + r.bias[2 * H + j]);
        const A o = sigmoid(r.pre[3 * H + j] + rec(3 * H + j) + r.bias[3 * H + j]);
        r.gates[j] = S(i);
        r.gates[H + j] = S(f);
        r.gates[2 * H + j] = S(g);
        r.gates[3 * H + j] = S(o);
        ct[j] = f * r.c[j] + i * g;
      });
    });
    if (r.norm_cw) {
      row_stats(loop, H, [&](int64_t j) RNN_ROW_LAMBDA { return ct[j]; }, r.stats_c);
      const A mean = r.stats_c[0], rstd = r.stats_c[1];
      store_htilde(loop, r, H, project, p_h, [&](int64_t j) RNN_ROW_LAMBDA {
        return A(r.gates[3 * H + j]) * tanh_act((ct[j] - mean) * rstd * r.norm_cw[j] + r.norm_cb[j]);
      });
    } else {
      store_htilde(loop, r, H, project, p_h,
                   [&](int64_t j) RNN_ROW_LAMBDA { return A(r.gates[3 * H + j]) * tanh_act(ct[j]); });
    }
    if (p_c != A(0)) zoneout_row(loop, r.c, r.c, r.ctil, r.keep_c, p_c, H);
    if (!project && p_h != A(0)) {
      zoneout_row(loop, r.h, r.h, r.htil, r.keep_h, p_h, P);
      write_h(loop, r.h, r.out, r.h_c, r.rscale, P);
    }
  }

  // Backward of one row (see OptBwdRow); the recurrent norm's part last.
  template <class L, typename S, typename A>
  RNN_HD static void backward(const L& loop, const OptBwdRow<S, A>& r, int64_t H, int64_t P, A p_c, A p_h,
                              bool project) {
    A* d = r.d;  // (H): d htilde, i.e. d(o * tanh(y)) before any projection
    if (project) {  // the driver's dr = dhtilde W_hr
      loop.each(H, [&](int64_t j) RNN_ROW_LAMBDA { d[j] = A(r.d_out[j]); });
    } else {
      hidden_grad(loop, d, r.dh, r.dh_in, r.rscale, r.d_out, r.keep_h, p_h, P);
    }
    if (r.norm_cw) {  // d ctilde through the cell norm, into d
      const A mean = r.stats_c[0], rstd = r.stats_c[1];
      loop.each(H, [&](int64_t j) RNN_ROW_LAMBDA {
        const A i = A(r.gates[j]), f = A(r.gates[H + j]), g = A(r.gates[2 * H + j]), o = A(r.gates[3 * H + j]);
        const A chat = (f * r.prev[j] + i * g - mean) * rstd;
        const A ty = tanh_act(chat * r.norm_cw[j] + r.norm_cb[j]);
        const A dy = d[j] * o * tanh_grad(ty);
        r.dG[3 * H + j] = d[j] * ty * sigmoid_grad(o);
        r.dy[j] = dy;
        r.chat[j] = chat;
        r.dgc[j] += dy * chat;
        r.dbc[j] += dy;
      });
      A s1, s2;
      loop.template sum2<A>(H, [&](int64_t j) RNN_ROW_LAMBDA { return r.dy[j] * r.norm_cw[j]; },
                            [&](int64_t j) RNN_ROW_LAMBDA { return r.dy[j] * r.norm_cw[j] * r.chat[j]; }, s1, s2);
      s1 /= A(H);
      s2 /= A(H);
      loop.each(H, [&](int64_t j) RNN_ROW_LAMBDA { d[j] = rstd * (r.dy[j] * r.norm_cw[j] - s1 - r.chat[j] * s2); });
      with_zoneout_mode(r.keep_c, p_c, [&](auto mode) RNN_ROW_LAMBDA {
        loop.each(H, [&](int64_t j) RNN_ROW_LAMBDA {
          const A i = A(r.gates[j]), f = A(r.gates[H + j]), g = A(r.gates[2 * H + j]);
          const A dc = r.dc[j];
          const A kept = zoneout_kept_share<decltype(mode)::value>(dc, r.keep_c, j, p_c);
          const A dct = d[j] + dc - kept;
          const A di = dct * g * sigmoid_grad(i), df = dct * r.prev[j] * sigmoid_grad(f);
          const A dg = dct * i * tanh_grad(g);
          r.dG[j] = di;
          r.dG[H + j] = df;
          r.dG[2 * H + j] = dg;
          r.db[j] += di;
          r.db[H + j] += df;
          r.db[2 * H + j] += dg;
          r.db[3 * H + j] += r.dG[3 * H + j];
          r.dc[j] = dct * f + kept;
        });
      });
    } else {  // ctilde = c's pre-zoneout value; one pass for the gates' gradients
      with_zoneout_mode(r.keep_c, p_c, [&](auto mode) RNN_ROW_LAMBDA {
        loop.each(H, [&](int64_t j) RNN_ROW_LAMBDA {
          const A i = A(r.gates[j]), f = A(r.gates[H + j]), g = A(r.gates[2 * H + j]), o = A(r.gates[3 * H + j]);
          const A ty = tanh_act(f * r.prev[j] + i * g);
          const A dj = d[j];
          const A dc = r.dc[j];
          const A kept = zoneout_kept_share<decltype(mode)::value>(dc, r.keep_c, j, p_c);
          const A dct = dj * o * tanh_grad(ty) + dc - kept;
          const A di = dct * g * sigmoid_grad(i), df = dct * r.prev[j] * sigmoid_grad(f);
          const A dg = dct * i * tanh_grad(g), d_o = dj * ty * sigmoid_grad(o);
          r.dG[j] = di;
          r.dG[H + j] = df;
          r.dG[2 * H + j] = dg;
          r.dG[3 * H + j] = d_o;
          r.db[j] += di;
          r.db[H + j] += df;
          r.db[2 * H + j] += dg;
          r.db[3 * H + j] += d_o;
          r.dc[j] = dct * f + kept;
        });
      });
    }
    if (r.dH) recurrent_norm_backward(loop, r, 4 * H);
  }
};

struct GruOptions {
  template <class L, typename S, typename A>
  RNN_HD static void forward(const L& loop, const OptFwdRow<S, A>& r, int64_t H, int64_t P, A p_c, A p_h,
                             bool project) {
    A* ht = p_h == A(0) ? r.h : r.htil;  // htilde, which is h_t itself without zoneout
    with_recurrent_side(loop, r, 3 * H, [&](auto rec) RNN_ROW_LAMBDA {
      loop.each(H, [&](int64_t j) RNN_ROW_LAMBDA {
        const A rg = sigmoid(r.pre[j] + rec(j) + r.bias[j]);
        const A z = sigmoid(r.pre[H + j] + rec(H + j) + r.bias[H + j]);
        const A hn = rec(2 * H + j) + r.b_hn[j];
        const A n = tanh_act(r.pre[2 * H + j] + r.bias[2 * H + j] + rg * hn);
        r.gates[j] = S(rg);
        r.gates[H + j] = S(z);
        r.gates[2 * H + j] = S(n);
        r.gates[3 * H + j] = S(hn);
        ht[j] = n + z * (r.h[j] - n);
      });
    });
    if (p_h != A(0)) zoneout_row(loop, r.h, r.h, r.htil, r.keep_h, p_h, H);
    write_h(loop, r.h, r.out, r.h_c, r.rscale, H);
  }

  template <class L, typename S, typename A>
  RNN_HD static void backward(const L& loop, const OptBwdRow<S, A>& r, int64_t H, int64_t P, A p_c, A p_h,
                              bool project) {
    A* d = r.d;  // (H) d htilde; r.dh keeps zoneout's share for h_{t-1}
    hidden_grad(loop, d, r.dh, r.dh_in, r.rscale, r.d_out, r.keep_h, p_h, H);
    loop.each(H, [&](int64_t j) RNN_ROW_LAMBDA {
      const A rg = A(r.gates[j]), z = A(r.gates[H + j]), n = A(r.gates[2 * H + j]), hn = A(r.gates[3 * H + j]);
      const A dht = d[j];
      const A dn = dht * (A(1) - z) * tanh_grad(n);
      const A drg = dn * hn * sigmoid_grad(rg), dz = dht * (r.prev[j] - n) * sigmoid_grad(z), dhn = dn * rg;
      r.dG[j] = drg;
      r.dG[H + j] = dz;
      r.dG[2 * H + j] = dhn;  // d(ah_n + b_hn)
      r.dG[3 * H + j] = dn;
      r.db[j] += drg;
      r.db[H + j] += dz;
      r.db[2 * H + j] += dhn;
      r.db[3 * H + j] += dn;
      r.dh[j] += dht * z;
    });
    if (r.dH) recurrent_norm_backward(loop, r, 3 * H);
  }
};

}  // namespace lrnn
