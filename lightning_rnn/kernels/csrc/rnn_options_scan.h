// The backward's scans with cell options (forward order, one sequence a row): the states
// a backward step reads (rnn_options.h) rebuilt from the saved gates and masks.
#pragma once

#include "rnn_options.h"

namespace lrnn {

// With a projection, after the step's h~ = r W_hr^T (written into out (P)): zoneout on
// h, the state h and the next step's GEMM input.
template <class L, typename S, typename A>
RNN_HD void finish_projected(const L& loop, A* h, S* out, S* h_c, A* scratch, const A* rscale,
                             const uint8_t* keep_h, int64_t P, A p_h) {
  loop.each(P, [&](int64_t j) RNN_ROW_LAMBDA { scratch[j] = A(out[j]); });
  zoneout_row(loop, h, h, scratch, keep_h, p_h, P);
  write_h(loop, h, out, h_c, rscale, P);
}

// hbar_{t-1} = h_{t-1} * rscale, dW_hh's row of a token.
template <class L, typename S, typename A>
RNN_HD void write_h_prev(const L& loop, S* h_prev_c, const A* h, const A* rscale, int64_t n) {
  if (rscale) {
    loop.each(n, [&](int64_t j) RNN_ROW_LAMBDA { h_prev_c[j] = S(h[j] * rscale[j]); });
  } else {
    loop.each(n, [&](int64_t j) RNN_ROW_LAMBDA { h_prev_c[j] = S(h[j]); });
  }
}

// The backward's scan of sequence b in forward order: the LSTM's zoned-out c_t (states)
// and, unless projected, hbar_{t-1} (h_prev_c) through zoneout on h; with a projection r_t
// for the driver. The GRU's h_{t-1} (states) and hbar_{t-1}.
// The LSTM's scan of sequence b without a projection, the cell norm or recurrent dropout
// (P == H), one pass a token: hbar_{t-1}, c_t and h_t through zoneout in modes MC, MH
// (rnn_rows.h: zoneout_mix).
template <int MC, int MH, class L, typename S, typename A>
RNN_HD void zoneout_scan(const L& loop, const OptScanArgs<S, A>& a, int64_t b) {
  const int64_t H = a.H;
  A* carry = a.carry + b * H;  // h_{t-1}
  loop.each(H, [&](int64_t j) RNN_ROW_LAMBDA { carry[j] = a.h0[b * H + j]; });
  const A* c_prev = a.c0 + b * H;
  const A p_c = a.p_c, p_h = a.p_h;
  for (int64_t k = 0; k < a.T; ++k) {
    const int64_t t = a.reverse ? a.T - 1 - k : k;
    if (b >= a.sizes[t]) continue;
    const int64_t tok = a.offsets[t] + b;
    const S* g = a.gates + tok * 4 * H;
    A* state = a.states + tok * H;
    S* hp = a.h_prev_c + tok * H;
    const uint8_t* keep_c = a.keep_c ? a.keep_c + tok * H : nullptr;
    const uint8_t* keep_h = a.keep_h ? a.keep_h + tok * H : nullptr;
    loop.each(H, [&](int64_t j) RNN_ROW_LAMBDA {
      const A h_prev = carry[j];
      hp[j] = S(h_prev);
      const A cp = c_prev[j];
      const A ct = A(g[H + j]) * cp + A(g[j]) * A(g[2 * H + j]);
      state[j] = zoneout_mix<MC>(cp, ct, keep_c, j, p_c);
      carry[j] = zoneout_mix<MH>(h_prev, A(g[3 * H + j]) * tanh_act(ct), keep_h, j, p_h);
    });
    c_prev = state;
  }
}

template <bool kLstm, class L, typename S, typename A>
RNN_HD void options_scan(const L& loop, const OptScanArgs<S, A>& a, int64_t b) {
  const int64_t H = a.H, P = a.P;
  if constexpr (kLstm) {
    if (!a.project && !a.stats_c && !a.rscale && (a.p_c != A(0) || a.p_h != A(0))) {
      with_zoneout_mode(a.keep_c, a.p_c, [&](auto mc) RNN_ROW_LAMBDA {
        with_zoneout_mode(a.keep_h, a.p_h, [&](auto mh) RNN_ROW_LAMBDA {
          zoneout_scan<decltype(mc)::value, decltype(mh)::value>(loop, a, b);
        });
      });
      return;
    }
  }
  A* carry = a.carry + b * P;  // h_{t-1}
  A* tilde = a.scratch + b * H;
  loop.each(P, [&](int64_t j) RNN_ROW_LAMBDA { carry[j] = a.h0[b * P + j]; });
  const A* c_prev = kLstm ? a.c0 + b * H : nullptr;
  const A* rs = a.rscale ? a.rscale + b * P : nullptr;
  for (int64_t k = 0; k < a.T; ++k) {
    const int64_t t = a.reverse ? a.T - 1 - k : k;
    if (b >= a.sizes[t]) continue;
    const int64_t tok = a.offsets[t] + b;
    const S* g = a.gates + tok * 4 * H;
    A* state = a.states + tok * H;
    if constexpr (kLstm) {
      if (!a.project && a.p_c == A(0) && a.p_h == A(0) && !rs) {  // one pass
        S* hp = a.h_prev_c + tok * P;
        if (a.stats_c) {
          const A mean = a.stats_c[2 * tok], rstd = a.stats_c[2 * tok + 1];
          loop.each(H, [&](int64_t j) RNN_ROW_LAMBDA {
            hp[j] = S(carry[j]);
            const A ct = A(g[H + j]) * c_prev[j] + A(g[j]) * A(g[2 * H + j]);
            state[j] = ct;
            carry[j] = A(g[3 * H + j]) * tanh_act((ct - mean) * rstd * a.norm_cw[j] + a.norm_cb[j]);
          });
        } else {
          loop.each(H, [&](int64_t j) RNN_ROW_LAMBDA {
            hp[j] = S(carry[j]);
            const A ct = A(g[H + j]) * c_prev[j] + A(g[j]) * A(g[2 * H + j]);
            state[j] = ct;
            carry[j] = A(g[3 * H + j]) * tanh_act(ct);
          });
        }
        c_prev = state;
        continue;
      }
    }
    if (!(kLstm && a.project)) write_h_prev(loop, a.h_prev_c + tok * P, carry, rs, P);
    if constexpr (kLstm) {
      loop.each(H, [&](int64_t j) RNN_ROW_LAMBDA { tilde[j] = A(g[H + j]) * c_prev[j] + A(g[j]) * A(g[2 * H + j]); });
      zoneout_row(loop, state, c_prev, tilde, a.keep_c ? a.keep_c + tok * H : nullptr, a.p_c, H);
      if (a.stats_c) {
        const A mean = a.stats_c[2 * tok], rstd = a.stats_c[2 * tok + 1];
        loop.each(H, [&](int64_t j) RNN_ROW_LAMBDA {
          tilde[j] = A(g[3 * H + j]) * tanh_act((tilde[j] - mean) * rstd * a.norm_cw[j] + a.norm_cb[j]);
        });
      } else {
        loop.each(H, [&](int64_t j) RNN_ROW_LAMBDA { tilde[j] = A(g[3 * H + j]) * tanh_act(tilde[j]); });
      }
      if (a.project) {
        loop.each(H, [&](int64_t j) RNN_ROW_LAMBDA { a.r[tok * H + j] = S(tilde[j]); });
      } else {
        zoneout_row(loop, carry, carry, tilde, a.keep_h ? a.keep_h + tok * P : nullptr, a.p_h, P);
      }
      c_prev = state;
    } else {
      loop.each(H, [&](int64_t j) RNN_ROW_LAMBDA {
        const A z = A(g[H + j]), n = A(g[2 * H + j]), hp = carry[j];
        state[j] = hp;
        tilde[j] = n + z * (hp - n);
      });
      zoneout_row(loop, carry, carry, tilde, a.keep_h ? a.keep_h + tok * H : nullptr, a.p_h, H);
    }
  }
}

// The projected LSTM's hbar_{t-1} (h_prev_c) of sequence b from h~_t = r_t W_hr^T (htil,
// (N, P)) through zoneout on h, in forward order.
template <class L, typename S, typename A>
RNN_HD void projected_scan(const L& loop, const OptScanArgs<S, A>& a, const S* htil, int64_t b) {
  const int64_t P = a.P;
  A* carry = a.carry + b * P;
  A* next = a.scratch + b * a.H;  // (P <= H columns)
  loop.each(P, [&](int64_t j) RNN_ROW_LAMBDA { carry[j] = a.h0[b * P + j]; });
  const A* rs = a.rscale ? a.rscale + b * P : nullptr;
  for (int64_t k = 0; k < a.T; ++k) {
    const int64_t t = a.reverse ? a.T - 1 - k : k;
    if (b >= a.sizes[t]) continue;
    const int64_t tok = a.offsets[t] + b;
    write_h_prev(loop, a.h_prev_c + tok * P, carry, rs, P);
    loop.each(P, [&](int64_t j) RNN_ROW_LAMBDA { next[j] = A(htil[tok * P + j]); });
    zoneout_row(loop, carry, carry, next, a.keep_h ? a.keep_h + tok * P : nullptr, a.p_h, P);
  }
}

}  // namespace lrnn
