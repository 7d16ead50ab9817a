// A transposed contiguous copy of a float32 matrix, in 8 x 8 register blocks.
//
// The backward's weight gradients run in oneDNN as (x^T dG)^T (rnn_gemm.h: wgrad_gemm),
// which needs x^T contiguous and returns the (in, out) result to transpose back. 8 x 8
// blocks transposed in vector registers, walked in 32 x 32 tiles, read and write whole
// vectors where ATen's strided copy moves one element at a time, and so take less time.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>

namespace lrnn {

namespace transpose_detail {

typedef float V8 __attribute__((vector_size(32)));
typedef int I8 __attribute__((vector_size(32)));

// Lanes of (a, b) picked by 8 constant indices into their concatenation (GCC's builtin
// since 4.7; __builtin_shufflevector only from GCC 12).
#if defined(__clang__)
#define LRNN_SHUFFLE(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define LRNN_SHUFFLE(a, b, ...) __builtin_shuffle(a, b, I8{__VA_ARGS__})
#endif

// d[j][i] = s[i][j] for an 8 x 8 block (row strides lds, ldd).
inline void block8(const float* s, int64_t lds, float* d, int64_t ldd) {
  V8 r[8];
  for (int i = 0; i < 8; ++i) std::memcpy(&r[i], s + i * lds, sizeof(V8));
  // interleave pairs of rows, then pairs of pairs, then swap the 128-bit halves
  V8 a[8], b[8];
  for (int i = 0; i < 4; ++i) {
    a[2 * i] = LRNN_SHUFFLE(r[2 * i], r[2 * i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    a[2 * i + 1] = LRNN_SHUFFLE(r[2 * i], r[2 * i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int i = 0; i < 2; ++i) {
    for (int h = 0; h < 2; ++h) {
      b[4 * i + 2 * h] = LRNN_SHUFFLE(a[4 * i + h], a[4 * i + 2 + h], 0, 1, 8, 9, 4, 5, 12, 13);
      b[4 * i + 2 * h + 1] = LRNN_SHUFFLE(a[4 * i + h], a[4 * i + 2 + h], 2, 3, 10, 11, 6, 7, 14, 15);
    }
  }
  for (int i = 0; i < 4; ++i) {
    const V8 lo = LRNN_SHUFFLE(b[i], b[i + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    const V8 hi = LRNN_SHUFFLE(b[i], b[i + 4], 4, 5, 6, 7, 12, 13, 14, 15);
    std::memcpy(d + i * ldd, &lo, sizeof(V8));
    std::memcpy(d + (i + 4) * ldd, &hi, sizeof(V8));
  }
}

#undef LRNN_SHUFFLE

}  // namespace transpose_detail

// a (M, K) -> a^T as a new contiguous (K, M) tensor. float32 with unit column stride on
// CPU takes the blocked path; anything else a.t().contiguous().
inline at::Tensor transposed(const at::Tensor& a) {
  if (a.dim() != 2 || !a.device().is_cpu() || a.scalar_type() != at::kFloat || a.stride(1) != 1) {
    return a.t().contiguous();
  }
  const int64_t M = a.size(0), K = a.size(1), lds = a.stride(0);
  at::Tensor out = at::empty({K, M}, a.options());
  const float* src = a.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  constexpr int64_t kTile = 32;
  at::parallel_for(0, (M + kTile - 1) / kTile, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t i0 = b0 * kTile; i0 < std::min(M, b1 * kTile); i0 += kTile) {
      const int64_t i1 = std::min(M, i0 + kTile);
      for (int64_t j0 = 0; j0 < K; j0 += kTile) {
        const int64_t j1 = std::min(K, j0 + kTile);
        const int64_t i8 = i0 + (i1 - i0) / 8 * 8, j8 = j0 + (j1 - j0) / 8 * 8;
        for (int64_t i = i0; i < i8; i += 8) {
          for (int64_t j = j0; j < j8; j += 8) transpose_detail::block8(src + i * lds + j, lds, dst + j * M + i, M);
        }
        // the ragged edges of the tile, one element at a time
        for (int64_t j = j0; j < j1; ++j) {
          for (int64_t i = (j < j8 ? i8 : i0); i < i1; ++i) dst[j * M + i] = src[i * lds + j];
        }
      }
    }
  });
  return out;
}

}  // namespace lrnn
