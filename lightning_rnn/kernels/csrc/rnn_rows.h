// Row passes for the cell options (rnn_options.h): a row is one sequence of a step, read
// through a row loop `L` with operations over the row's columns: L::each(n, f) runs f(j)
// for every j < n (the CPU: a vectorized loop; CUDA: the threads of the row's block, then
// a barrier), L::sum(n, f) returns the sum of f(j) over j < n (to every thread), L::sum2(n,
// f, g) the sums of f(j) and of g(j) in one pass. Every option is decided outside the
// loops, which stay branch-free so that they vectorize. A = the state dtype, S = compute.
// Masks are bytes (1: keep the previous value, zoneout); a null mask with p > 0 is
// evaluation, which mixes with the expectation p; p == 0 is the option off.
#pragma once

#include <cmath>
#include <cstdint>

#include "rnn_math.h"

namespace lrnn {

constexpr double kNormEps = 1e-5;  // layer norm's epsilon (kernels/cell.py: NORM_EPS)

// The row loops' lambdas inlined into their (vectorized) loops on the CPU: GCC leaves a
// lambda as large as a cell's element math out of line otherwise, and the loop scalar.
#if defined(__CUDACC__)
#define RNN_ROW_LAMBDA
#else
#define RNN_ROW_LAMBDA __attribute__((always_inline))
#endif

// out = d * prev + (1 - d) * next over n columns: d the mask (training), its expectation
// p (evaluation, no mask), or next itself (p == 0). out may be prev or next.
template <class L, typename A>
RNN_HD void zoneout_row(const L& loop, A* out, const A* prev, const A* next, const uint8_t* keep, A p, int64_t n) {
  if (p == A(0)) {
    if (out != next) loop.each(n, [&](int64_t j) RNN_ROW_LAMBDA { out[j] = next[j]; });
  } else if (keep) {
    loop.each(n, [&](int64_t j) RNN_ROW_LAMBDA { out[j] = keep[j] ? prev[j] : next[j]; });
  } else {
    loop.each(n, [&](int64_t j) RNN_ROW_LAMBDA { out[j] = next[j] + p * (prev[j] - next[j]); });
  }
}

// Zoneout's backward over n columns: of the gradient d, the share of the previous value
// goes to kept, the rest stays in d.
template <class L, typename A>
RNN_HD void zoneout_split(const L& loop, A* d, A* kept, const uint8_t* keep, A p, int64_t n) {
  if (p == A(0)) {
    loop.each(n, [&](int64_t j) RNN_ROW_LAMBDA { kept[j] = A(0); });
  } else if (keep) {
    loop.each(n, [&](int64_t j) RNN_ROW_LAMBDA {
      const A v = d[j];
      kept[j] = keep[j] ? v : A(0);
      d[j] = keep[j] ? A(0) : v;
    });
  } else {
    loop.each(n, [&](int64_t j) RNN_ROW_LAMBDA {
      const A v = d[j];
      kept[j] = p * v;
      d[j] = v - p * v;
    });
  }
}

// The step output h (state dtype) as the output row and the next GEMM's input h * rscale.
template <class L, typename S, typename A>
RNN_HD void write_h(const L& loop, const A* h, S* out, S* h_c, const A* rscale, int64_t n) {
  if (rscale) {
    loop.each(n, [&](int64_t j) RNN_ROW_LAMBDA {
      out[j] = S(h[j]);
      h_c[j] = S(h[j] * rscale[j]);
    });
  } else {
    loop.each(n, [&](int64_t j) RNN_ROW_LAMBDA { out[j] = h_c[j] = S(h[j]); });
  }
}

// [mean, 1 / sqrt(var + eps)] of v(j) over j < n (biased variance, two passes).
template <class L, typename A, class V>
RNN_HD void row_stats(const L& loop, int64_t n, V v, A* stats) {
  const A mean = loop.template sum<A>(n, [&](int64_t j) RNN_ROW_LAMBDA { return A(v(j)); }) / A(n);
  const A var = loop.template sum<A>(n, [&](int64_t j) RNN_ROW_LAMBDA {
    const A d = A(v(j)) - mean;
    return d * d;
  }) / A(n);
  stats[0] = mean;
  stats[1] = A(1) / std::sqrt(var + A(kNormEps));
}

// ---- a layer norm over whole rows (the input side, all tokens at once) ------------------
// v (F) in place: (v - mean) * rstd * w + b.
template <class L, typename A>
RNN_HD void norm_row(const L& loop, A* v, const A* w, const A* b, int64_t F) {
  A stats[2];
  row_stats(loop, F, [&](int64_t k) RNN_ROW_LAMBDA { return v[k]; }, stats);
  const A mean = stats[0], rstd = stats[1];
  loop.each(F, [&](int64_t k) RNN_ROW_LAMBDA { v[k] = (v[k] - mean) * rstd * w[k] + b[k]; });
}

// The gradient of the norm's input a (F) from its output's dy (F): da = rstd (w dy -
// mean(w dy) - a_hat mean(w dy a_hat)); a is overwritten with a_hat (for the parameters'
// gradients).
template <class L, typename A, typename O>
RNN_HD void norm_row_backward(const L& loop, const A* dy, A* a, const A* w, O* da, int64_t F) {
  A stats[2];
  row_stats(loop, F, [&](int64_t k) RNN_ROW_LAMBDA { return a[k]; }, stats);
  const A mean = stats[0], rstd = stats[1];
  loop.each(F, [&](int64_t k) RNN_ROW_LAMBDA { a[k] = (a[k] - mean) * rstd; });
  A s1, s2;
  loop.template sum2<A>(F, [&](int64_t k) RNN_ROW_LAMBDA { return dy[k] * w[k]; },
                        [&](int64_t k) RNN_ROW_LAMBDA { return dy[k] * w[k] * a[k]; }, s1, s2);
  s1 /= A(F);
  s2 /= A(F);
  loop.each(F, [&](int64_t k) RNN_ROW_LAMBDA { da[k] = O(rstd * (dy[k] * w[k] - s1 - a[k] * s2)); });
}

// d = dh + dh_in * rscale + d_out over n columns (dh_in, rscale optional).
template <class L, typename S, typename A>
RNN_HD void total_grad(const L& loop, A* d, const A* dh, const S* dh_in, const A* rscale, const S* d_out, int64_t n) {
  if (dh_in && rscale) {
    loop.each(n, [&](int64_t j) RNN_ROW_LAMBDA { d[j] = dh[j] + A(dh_in[j]) * rscale[j] + A(d_out[j]); });
  } else if (dh_in) {
    loop.each(n, [&](int64_t j) RNN_ROW_LAMBDA { d[j] = dh[j] + A(dh_in[j]) + A(d_out[j]); });
  } else {
    loop.each(n, [&](int64_t j) RNN_ROW_LAMBDA { d[j] = dh[j] + A(d_out[j]); });
  }
}

// Zoneout's split of a gradient v into (kept, rest) in mode M: 0 off (all rest), 1 mask,
// 2 expectation p. Modes are picked outside the loops (with_zoneout_mode).
template <int M, typename A>
RNN_HD A zoneout_kept_share(A v, const uint8_t* keep, int64_t j, A p) {
  if constexpr (M == 0) return A(0);
  if constexpr (M == 1) return keep[j] ? v : A(0);
  return p * v;
}

// Zoneout's value of column j in mode M (as zoneout_row): next (0), the mask's pick of
// prev or next (1), the expectation next + p * (prev - next) (2).
template <int M, typename A>
RNN_HD A zoneout_mix(A prev, A next, const uint8_t* keep, int64_t j, A p) {
  if constexpr (M == 0) return next;
  if constexpr (M == 1) return keep[j] ? prev : next;
  return next + p * (prev - next);
}

template <int M>
struct ZoneoutMode {
  static constexpr int value = M;
};

template <typename A, class F>
RNN_HD void with_zoneout_mode(const uint8_t* keep, A p, F f) {
  if (p == A(0)) {
    f(ZoneoutMode<0>{});
  } else if (keep) {
    f(ZoneoutMode<1>{});
  } else {
    f(ZoneoutMode<2>{});
  }
}

}  // namespace lrnn
