// The pointwise math of one LSTM / GRU element, shared by the CPU and CUDA backends.
//
// Each device loops over (row b, column j) of a step and calls the cell's element
// function with *row pointers* (already offset to row b); j indexes the H columns.
// S = compute dtype (GEMM operands, saved gates, outputs: float, double, bf16, fp16),
// A = state dtype (pre-activation sums, cell/hidden state, gradient accumulation).
//
// Gate layouts (H columns per gate block):
//   LSTM projection/saved gates (4H): [i, f, g, o]
//   GRU  projection (3H): [r, z, n];  saved gates (4H): [r, z, n, W_hn h + b_hn]
//   GRU  gate gradients (4H, internal): [dr, dz, dhn, dn] so that the recurrent
//        part [dr, dz, dhn] is one contiguous (n, 3H) block for the per-step GEMM.
#pragma once

#include <cstdint>

#include "rnn_math.h"

namespace lrnn {

// ---- forward step --------------------------------------------------------------------
template <typename S, typename A>
struct FwdRow {
  const S* pre;   // (G*H) input projection x W_ih^T of this token
  const S* hw;    // (G*H) h_{t-1} W_hh^T; null when the GEMM already added it into pre
  const A* bias;  // (G*H) folded bias (zeros when the layer has none)
  const A* b_hn;  // (H) GRU: b_hn, kept apart because r multiplies it
  S* gates;       // (4H) activated gates, saved for backward
  A* h;           // (H) GRU hidden state (state dtype)
  A* c;           // (H) LSTM cell state
  S* h_c;         // (H) hidden state in compute dtype: next step's GEMM input
  S* out;         // (H) layer output of this token
};

template <typename S, typename A>
struct FwdStep {  // one time step, rows [0, n)
  const S* pre; const S* hw; const A* bias; const A* b_hn;
  S* gates; A* h; A* c; S* h_c; S* out;
  int64_t n, H, G;
  RNN_HD FwdRow<S, A> row(int64_t b) const {
    return {pre + b * G * H, hw ? hw + b * G * H : nullptr, bias, b_hn, gates + b * 4 * H,
            h + b * H, c + b * H, h_c + b * H, out + b * H};
  }
};

// ---- backward: rebuild the forward states by a pointwise scan -----------------------
template <typename S, typename A>
struct ScanRow {
  const S* gates;  // (4H) saved gates of this token
  const A* prev;   // (H) LSTM: c_{t-1};  GRU: h_{t-1}
  A* cur;          // (H) LSTM: c_t is written;  GRU: h_{t-1} is written (kept for backward)
  A* next;         // (H) GRU: h_t, i.e. the next token's h_{t-1}
  S* next_c;       // (H) GRU: h_t in compute dtype, the next token's GEMM row for dW_hh
};

template <typename S, typename A>
struct ScanArgs {  // the whole direction
  const S* gates;      // (N, 4H)
  const A* h0;         // (B, H) initial state, state dtype
  const A* c0;         // (B, H) LSTM initial cell state
  A* states;           // (N, H) LSTM: c_t;  GRU: h_{t-1} per token
  S* h_prev_c;         // (N, H) h_{t-1} per token in compute dtype (for dW_hh): the scan
                       //     writes h0 at each sequence's first token, the GRU all rows
                       //     (the LSTM's other rows come from its backward pass: BwdRow::h_out)
  A* tail;             // (B, H) scratch: where the last token's "next" goes
  S* tail_c;           // (B, H)
  const int64_t* sizes; const int64_t* offsets;
  int64_t T, H;
  bool reverse;
  // LSTM with a projection: h_prev_c holds r_t = o * tanh(c_t) at each token's own row
  // (the backward pass writes it; the driver projects and shifts it to h_{t-1} itself),
  // so the scan writes no h0 there.
  bool at_token;
};

// Walks the tokens of batch row b in forward order, calling
// visit(ScanRow row, const A* h0_row, S* h_prev_c_row, bool first) for each; `first`
// (the token whose h_{t-1} is h0) is never set with at_token.
template <class Cell, typename S, typename A, class Visit>
RNN_HD void scan_tokens(const ScanArgs<S, A>& a, int64_t b, Visit&& visit) {
  const int64_t H = a.H;
  int64_t ptok = -1;
  for (int64_t k = 0; k < a.T; ++k) {
    const int64_t t = a.reverse ? a.T - 1 - k : k;
    if (b >= a.sizes[t]) continue;
    const int64_t tok = a.offsets[t] + b;
    const int64_t t2 = a.reverse ? t - 1 : t + 1;
    const int64_t ntok = (t2 >= 0 && t2 < a.T && b < a.sizes[t2]) ? a.offsets[t2] + b : -1;
    visit(Cell::scan_row(a, b, tok, ptok, ntok), a.h0 + b * H, a.h_prev_c + tok * H, ptok < 0 && !a.at_token);
    ptok = tok;
  }
}

// ---- backward step ------------------------------------------------------------------
template <typename S, typename A>
struct BwdRow {
  const S* gates;  // (4H) saved gates
  const A* state;  // (H) LSTM: c_t;  GRU: h_{t-1}
  const A* prev;   // (H) LSTM: c_{t-1}
  const S* d_out;  // (H) gradient of the output
  const S* dh_in;  // (H) from the previous backward step's GEMM (zeros if none); null when
                   //     that GEMM accumulates straight into dh (compute dtype == state dtype)
  A* dh;           // (H) carried dh (d h_n initially); the cell writes its carry
  A* dc;           // (H) LSTM carried dc
  S* dG;           // (4H) pre-activation gradients
  A* db;           // (4H) per-row bias gradient accumulator
  S* h_out;        // (H) LSTM: o * tanh(c_t) in compute dtype, the next token's h_{t-1} for
                   //     dW_hh (a scratch row where no next token exists; with a projection
                   //     r_t in this token's own row); the GRU writes none
};

template <typename S, typename A>
struct BwdStep {  // one time step, rows [0, n)
  const S* gates; const A* state;
  const A* prev; const A* c0; int64_t m_prev;  // prev rows valid for b < m_prev, else c0
  const S* d_out; const S* dh_in; const S* zeros; int64_t m_in;  // dh_in valid for b < m_in
  A* dh; A* dc; S* dG; A* db;
  S* h_next; int64_t m_next; S* h_spare;  // h_out rows: h_next's for b < m_next, else h_spare's
  int64_t n, H;
  RNN_HD BwdRow<S, A> row(int64_t b) const {
    return {gates + b * 4 * H, state + b * H, b < m_prev ? prev + b * H : c0 + b * H,
            d_out + b * H, !dh_in ? nullptr : b < m_in ? dh_in + b * H : zeros, dh + b * H, dc + b * H,
            dG + b * 4 * H, db + b * 4 * H, b < m_next ? h_next + b * H : h_spare + b * H};
  }
};

// ---- cells ---------------------------------------------------------------------------
// p[j] as A, or 0 when the GEMM already accumulated that term elsewhere:
// forward<kHw = false>: h W_hh^T was added into pre in place (hw is null);
// backward<kDhIn = false>: dG_h W_hh was added into dh (dh_in is null).
template <bool kOn, typename T, typename A>
RNN_HD A load_if(const T* p, int64_t j) {
  if constexpr (kOn) return A(p[j]);
  return A(0);
}

// p[k*H + j] = v_k for the four H-column blocks of a (4H) row (gates, gate gradients).
template <typename T, typename V>
RNN_HD void store4(T* p, int64_t H, int64_t j, V v0, V v1, V v2, V v3) {
  p[j] = T(v0);
  p[H + j] = T(v1);
  p[2 * H + j] = T(v2);
  p[3 * H + j] = T(v3);
}

// dG[k*H + j] = d_k in the compute dtype and db[k*H + j] += d_k (per-row bias gradient).
template <typename S, typename A>
RNN_HD void store_gate_grads(S* dG, A* db, int64_t H, int64_t j, A d0, A d1, A d2, A d3) {
  store4(dG, H, j, d0, d1, d2, d3);
  db[j] += d0;
  db[H + j] += d1;
  db[2 * H + j] += d2;
  db[3 * H + j] += d3;
}

struct LstmCell {
  static constexpr int kProjGates = 4;   // columns of W_ih / W_hh, in units of H
  static constexpr int kHiddenGrad = 4;  // dG columns [0, kHiddenGrad*H) feed dh_{t-1}
  static constexpr bool kHwInPre = true;  // h W_hh^T can be accumulated into pre in place

  template <bool kHw, typename S, typename A>
  RNN_HD static void forward(const FwdRow<S, A>& r, int64_t H, int64_t j) {
    A pi = A(r.pre[j]) + load_if<kHw, S, A>(r.hw, j) + r.bias[j];
    A pf = A(r.pre[H + j]) + load_if<kHw, S, A>(r.hw, H + j) + r.bias[H + j];
    A pg = A(r.pre[2 * H + j]) + load_if<kHw, S, A>(r.hw, 2 * H + j) + r.bias[2 * H + j];
    A po = A(r.pre[3 * H + j]) + load_if<kHw, S, A>(r.hw, 3 * H + j) + r.bias[3 * H + j];
    A i = sigmoid(pi), f = sigmoid(pf), g = tanh_act(pg), o = sigmoid(po);
    store4(r.gates, H, j, i, f, g, o);
    A c = f * r.c[j] + i * g;
    r.c[j] = c;
    S h = S(o * tanh_act(c));
    r.h_c[j] = h;
    r.out[j] = h;
  }

  template <typename S, typename A>
  RNN_HD static ScanRow<S, A> scan_row(const ScanArgs<S, A>& a, int64_t b, int64_t tok, int64_t ptok,
                                       int64_t ntok) {
    const int64_t H = a.H;
    return {a.gates + tok * 4 * H, ptok < 0 ? a.c0 + b * H : a.states + ptok * H, a.states + tok * H,
            a.tail + b * H, nullptr};
  }

  // c_t only: h_t = o * tanh(c_t) for dW_hh is written by the backward pass, which
  // computes tanh(c_t) anyway (one tanh per element less than rebuilding h_t here).
  template <typename S, typename A>
  RNN_HD static void scan(const ScanRow<S, A>& r, int64_t H, int64_t j) {
    A i = A(r.gates[j]), f = A(r.gates[H + j]), g = A(r.gates[2 * H + j]);
    r.cur[j] = f * r.prev[j] + i * g;
  }

  template <bool kDhIn, typename S, typename A>
  RNN_HD static void backward(const BwdRow<S, A>& r, int64_t H, int64_t j) {
    A i = A(r.gates[j]), f = A(r.gates[H + j]), g = A(r.gates[2 * H + j]), o = A(r.gates[3 * H + j]);
    A tc = tanh_act(r.state[j]);
    A dh = r.dh[j] + load_if<kDhIn, S, A>(r.dh_in, j) + A(r.d_out[j]);
    A dc = r.dc[j] + dh * o * tanh_grad(tc);
    A di = dc * g * sigmoid_grad(i);
    A df = dc * r.prev[j] * sigmoid_grad(f);
    A dg = dc * i * tanh_grad(g);
    A d_o = dh * tc * sigmoid_grad(o);
    store_gate_grads(r.dG, r.db, H, j, di, df, dg, d_o);
    r.dc[j] = dc * f;
    r.dh[j] = A(0);
    r.h_out[j] = S(o * tc);
  }
};

struct GruCell {
  static constexpr int kProjGates = 3;
  static constexpr int kHiddenGrad = 3;  // [dr, dz, dhn]
  static constexpr bool kHwInPre = false;  // r multiplies W_hn h: hw must stay apart

  template <bool kHw, typename S, typename A>
  RNN_HD static void forward(const FwdRow<S, A>& r, int64_t H, int64_t j) {
    A rg = sigmoid(A(r.pre[j]) + A(r.hw[j]) + r.bias[j]);
    A z = sigmoid(A(r.pre[H + j]) + A(r.hw[H + j]) + r.bias[H + j]);
    A hn = A(r.hw[2 * H + j]) + r.b_hn[j];
    A n = tanh_act(A(r.pre[2 * H + j]) + r.bias[2 * H + j] + rg * hn);
    A h = n + z * (r.h[j] - n);
    store4(r.gates, H, j, rg, z, n, hn);
    r.h[j] = h;
    r.h_c[j] = S(h);
    r.out[j] = S(h);
  }

  template <typename S, typename A>
  RNN_HD static ScanRow<S, A> scan_row(const ScanArgs<S, A>& a, int64_t b, int64_t tok, int64_t ptok,
                                       int64_t ntok) {
    const int64_t H = a.H;
    return {a.gates + tok * 4 * H, ptok < 0 ? a.h0 + b * H : a.states + tok * H, a.states + tok * H,
            ntok < 0 ? a.tail + b * H : a.states + ntok * H,
            ntok < 0 ? a.tail_c + b * H : a.h_prev_c + ntok * H};
  }

  template <typename S, typename A>
  RNN_HD static void scan(const ScanRow<S, A>& r, int64_t H, int64_t j) {
    A z = A(r.gates[H + j]), n = A(r.gates[2 * H + j]);
    A hp = r.prev[j];
    r.cur[j] = hp;
    A h = n + z * (hp - n);
    r.next[j] = h;
    r.next_c[j] = S(h);
  }

  template <bool kDhIn, typename S, typename A>
  RNN_HD static void backward(const BwdRow<S, A>& r, int64_t H, int64_t j) {
    A rg = A(r.gates[j]), z = A(r.gates[H + j]), n = A(r.gates[2 * H + j]), hn = A(r.gates[3 * H + j]);
    A dh = r.dh[j] + load_if<kDhIn, S, A>(r.dh_in, j) + A(r.d_out[j]);
    A dn = dh * (A(1) - z) * tanh_grad(n);
    A dz = dh * (r.state[j] - n) * sigmoid_grad(z);
    A dr = dn * hn * sigmoid_grad(rg);
    A dhn = dn * rg;
    store_gate_grads(r.dG, r.db, H, j, dr, dz, dhn, dn);
    r.dh[j] = dh * z;
  }
};

}  // namespace lrnn
