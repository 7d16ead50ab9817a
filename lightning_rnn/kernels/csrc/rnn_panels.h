// A GEMM on CPU, float32, y (n, N) = a (n, K) M with M copied into panels, for the
// per-step recurrent products (n up to kPanelMaxRows rows, M reused every step) and, where
// MKL runs its generic kernels, for the input projection and the backward's input
// gradient dG W_ih at small K (rnn_gemm.h: proj_gemm_pooled, input_grad_gemm).
//
// M is copied once per call into panels of two vectors' width (kWidth columns: 16 with
// AVX2, 32 with AVX-512), (P, K, kWidth) row-major, so that one panel is a contiguous
// strip. For each panel the kernel keeps a tile of up to 6 rows x kWidth columns of y in
// 12 vector registers and walks k: per k, two vector loads of the panel, one broadcast of
// a[r][k] per row, two FMAs per row. The n rows are split into tiles of 5 and 6 rows where
// they can be (tile_rows_at); a step's tiles take k in blocks of kDepthBlock, all tiles
// one block after another (run_rows). M is read once per tile from a strip in L1/L2,
// a in place (any row stride). A tile of a whole panel is stored with two vector stores
// per row, with no stack copy and memcpy of `cols` floats, which only the last, partial
// panel needs. While its first tile runs, a panel prefetches the next one into L2, its
// row k at step k: past L2 (W_hh of hidden 512 is 4 MB) the strips otherwise arrive from
// L3 at the pace of the first tile's demand misses, which matters most for small batches.
//
// Why panels for the step GEMMs: a step has few rows (the batch), too few for MKL's and
// oneDNN's blocking to pay off, and M is the same at every step, so its one-time copy
// into panels is spread over T steps. For steps of up to kPanelMaxRows rows the panels
// beat oneDNN with a packed W_hh and at::mm, most at small batches; from 128 rows on the
// libraries are as fast or faster. The layer-level effect is in the benchmark's grid
// (docs/benchmarks.md).
// The columns are written with plain vector types (GCC/Clang vector extensions), which
// compile to AVX-512 or AVX2/FMA under -march=native and to narrower code elsewhere.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>

#if __has_include(<unistd.h>)
#include <unistd.h>
#endif

// clang splits 512-bit vectors into 256-bit halves where the target prefers 256-bit ones
// (-march=native on most AVX-512 CPUs), unless told the function needs them, and the
// panel GEMM then runs at half width. GCC keeps the vector types as written.
#if defined(__clang__) && defined(__AVX512F__)
#define LRNN_WIDE_VECTORS __attribute__((min_vector_width(512)))
#else
#define LRNN_WIDE_VECTORS
#endif

namespace lrnn {

// Widest step (rows) the panel GEMM takes; wider steps use oneDNN / ATen (see above).
constexpr int64_t kPanelMaxRows = 64;

class PanelGemm {
  static bool enabled_by_default() {
    const char* env = std::getenv("LIGHTNING_RNN_NO_PANELS");
    return !(env && env[0] && env[0] != '0');
  }
  static std::atomic<bool>& flag() {
    static std::atomic<bool> on{enabled_by_default()};
    return on;
  }

 public:
  // Floats per vector: the widest registers the build targets (-march=native). On a CPU
  // with AVX-512, 8-float (AVX2) tiles lose to MKL's and oneDNN's 16-float kernels; only
  // 16-float tiles beat them.
#if defined(__AVX512F__)
  static constexpr int64_t kLanes = 16;
#else
  static constexpr int64_t kLanes = 8;
#endif
  static constexpr int64_t kWidth = 2 * kLanes;  // columns per panel: two vectors
  static constexpr int64_t kTileRows = 6;  // most rows per register tile: 12 accumulators
  static constexpr int64_t kDepthBlock = 256;  // k per block of a tile's sums (tile)

  // Whether panels can take operands like t: CPU float32.
  static bool supports(const at::Tensor& t) { return t.device().is_cpu() && t.scalar_type() == at::kFloat; }

  // Whether the kernels use panels at all: yes unless LIGHTNING_RNN_NO_PANELS=1 (then
  // MKL / oneDNN); set_enabled (the extension's set_panels, for tests) switches them at
  // run time.
  static bool enabled() { return flag().load(std::memory_order_relaxed); }
  static void set_enabled(bool on) { flag().store(on, std::memory_order_relaxed); }

  // Whether panels serve a step GEMM with up to `rows` rows and operands like t.
  static bool usable(const at::Tensor& t, int64_t rows) {
    return enabled() && supports(t) && rows <= kPanelMaxRows;
  }

  // Whether panels of M suit the step GEMMs of this build: with 8-float tiles (AVX2)
  // always (see above); with 16-float tiles (AVX-512) where M fits in this core's L2:
  // an M that does not (W_hh^T of hidden 512 is 4 MB) streams from L3 at every step, and
  // MKL's / oneDNN's AVX-512 kernels, which block for that, are then the faster ones.
  static bool suits(const at::Tensor& m) {
    return kLanes < 16 || m.numel() * static_cast<int64_t>(sizeof(float)) <= l2_bytes();
  }

  // This core's L2 cache (sysconf), 1 MB where the system does not say.
  static int64_t l2_bytes() {
    static const int64_t bytes = [] {
      long v = -1;
#ifdef _SC_LEVEL2_CACHE_SIZE
      v = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
      return v > 0 ? static_cast<int64_t>(v) : int64_t(1) << 20;
    }();
    return bytes;
  }

  // M (K, N) float32, any strides -> panels (ceil(N / kWidth), K, kWidth), the last
  // zero-padded. One pass over M, a panel at a time: rows of kWidth floats where M's
  // columns are contiguous (the backward's W_hh), else one column of M per panel column
  // (the forward's W_hh^T, a transposed view), writing into the panel (K x kWidth floats)
  // in cache: one pass, where a zero-padded copy and a permuted one through ATen would
  // take three.
  static at::Tensor pack(const at::Tensor& m) {
    TORCH_CHECK(m.dim() == 2 && m.scalar_type() == at::kFloat, "PanelGemm::pack: expected a float32 matrix");
    const int64_t K = m.size(0), N = m.size(1), P = (N + kWidth - 1) / kWidth;
    const int64_t sk = m.stride(0), sn = m.stride(1);
    at::Tensor panels = at::empty({P, K, kWidth}, m.options());
    const float* src = m.data_ptr<float>();
    float* dst = panels.data_ptr<float>();
    at::parallel_for(0, P, 1, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t cols = std::min<int64_t>(kWidth, N - p * kWidth);
        float* d = dst + p * K * kWidth;
        const float* s = src + p * kWidth * sn;
        if (sn == 1) {
          for (int64_t k = 0; k < K; ++k) std::memcpy(d + k * kWidth, s + k * sk, cols * sizeof(float));
        } else {
          for (int64_t j = 0; j < cols; ++j) {
            for (int64_t k = 0; k < K; ++k) d[k * kWidth + j] = s[j * sn + k * sk];
          }
        }
        for (int64_t j = cols; j < kWidth; ++j) {
          for (int64_t k = 0; k < K; ++k) d[k * kWidth + j] = 0.0f;
        }
      }
    });
    return panels;
  }

  // y (n, N) = a (n, K) @ M for M = panels of pack(); a and y: unit column stride.
  static void run(const at::Tensor& a, const at::Tensor& panels, int64_t N, at::Tensor& y) {
    const int64_t n = a.size(0);
    TORCH_CHECK(a.size(1) == panels.size(1) && a.stride(1) == 1 && y.size(0) == n && y.size(1) == N &&
                    y.stride(1) == 1,
                "PanelGemm: shapes a ", a.sizes(), " y ", y.sizes(), " vs panels ", panels.sizes());
    run_rows(a.data_ptr<float>(), a.stride(0), n, panels, N, y.data_ptr<float>(), y.stride(0));
  }

  // The same on rows given by pointer: a (n, K) with row stride lda, y (n, N) with row
  // stride ldy, K = panels.size(1). The per-step GEMMs call this with rows of the
  // driver's buffers, which as tensors would be views made afresh each step (rnn_gemm.h:
  // StepGemm::run_rows).
  static void run_rows(const float* A, int64_t lda, int64_t n, const at::Tensor& panels, int64_t N, float* Y,
                       int64_t ldy) {
    const int64_t K = panels.size(1), P = panels.size(0);
    const float* M = panels.data_ptr<float>();
    // hand panels to threads in groups of at least ~64K multiply-adds (K x 16 x n per panel)
    const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, K * kWidth * n));
    at::parallel_for(0, P, grain, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t cols = std::min<int64_t>(kWidth, N - p * kWidth);
        // the first tile of a panel prefetches the next one (one line per k) into L2
        const float* next = p + 1 < p1 ? M + (p + 1) * K * kWidth : nullptr;
        // k in blocks of kDepthBlock outside the rows' tiles: each block of the panel (32 KB
        // with AVX-512) stays in L1 for all tiles of the step, where a tile over all K (the
        // backward's 4H) streamed the whole strip from L2 once per tile; y's rows are added
        // into per block. For more rows than a step's, whose strip of y would leave L1, one
        // tile runs over all K.
        const bool blocks_outside = n <= kPanelMaxRows;
        const int64_t block = blocks_outside ? kDepthBlock : std::max<int64_t>(K, 1);
        for (int64_t k0 = 0; k0 < K || k0 == 0; k0 += block) {
          const int64_t kb = std::min(block, K - k0);
          for (int64_t r0 = 0, rows; r0 < n; r0 += rows) {
            rows = tile_rows_at(n - r0);
            tile_rows(rows, A + r0 * lda + k0, lda, M + p * K * kWidth + k0 * kWidth, kb, Y + r0 * ldy + p * kWidth,
                      ldy, cols, r0 == 0 && next ? next + k0 * kWidth : nullptr, k0 > 0);
          }
        }
      }
    });
  }

  // Rows of the next register tile when `left` rows of y remain: the first tile of the
  // cheapest split of min(left, kPanelMaxRows) rows into tiles of 1-6 rows (tiles of 5
  // while more remain). kCost is the relative cost per row of a tile of R rows, measured
  // standalone (K 256-2048, all rows in tiles of R): 5 and 6 rows about equal, 2-4 rows
  // half as much again, 1 row over twice. Tiles of fewer than 5 rows keep fewer than 10
  // accumulator chains in flight and wait on the FMA latency; so 64 rows split as
  // 4 x 6 + 8 x 5 rather than 10 x 6 + 4, and 50 rows as 10 x 5.
  static int64_t tile_rows_at(int64_t left) {
    static const std::array<int8_t, kPanelMaxRows + 1> first = [] {
      constexpr int kCost[kTileRows + 1] = {0, 220, 150, 150, 150, 100, 102};  // per row, x 100
      std::array<int, kPanelMaxRows + 1> best{};
      std::array<int8_t, kPanelMaxRows + 1> plan{};
      for (int m = 1; m <= kPanelMaxRows; ++m) {
        best[m] = INT_MAX;
        for (int r = std::min<int>(m, kTileRows); r >= 1; --r) {  // ties: the wider tile first
          const int cost = best[m - r] + r * kCost[r];
          if (cost < best[m]) best[m] = cost, plan[m] = static_cast<int8_t>(r);
        }
      }
      return plan;
    }();
    return left > kPanelMaxRows ? 5 : first[left];
  }

 private:
  typedef float Vec __attribute__((vector_size(kLanes * sizeof(float))));

  static void tile_rows(int64_t rows, const float* a, int64_t lda, const float* panel, int64_t K, float* y,
                        int64_t ldy, int64_t cols, const float* next, bool add) {
    if (next) return tile_rows_with<true>(rows, a, lda, panel, K, y, ldy, cols, next, add);
    return tile_rows_with<false>(rows, a, lda, panel, K, y, ldy, cols, next, add);
  }

  template <bool kPrefetch>
  static void tile_rows_with(int64_t rows, const float* a, int64_t lda, const float* panel, int64_t K, float* y,
                             int64_t ldy, int64_t cols, const float* next, bool add) {
    switch (rows) {
      case kTileRows: return tile<kTileRows, kPrefetch>(a, lda, panel, K, y, ldy, cols, next, add);
      case 5: return tile<5, kPrefetch>(a, lda, panel, K, y, ldy, cols, next, add);
      case 4: return tile<4, kPrefetch>(a, lda, panel, K, y, ldy, cols, next, add);
      case 3: return tile<3, kPrefetch>(a, lda, panel, K, y, ldy, cols, next, add);
      case 2: return tile<2, kPrefetch>(a, lda, panel, K, y, ldy, cols, next, add);
      default: return tile<1, kPrefetch>(a, lda, panel, K, y, ldy, cols, next, add);
    }
  }

  // y[r][0:cols) = sum_k a[r][k] panel[k][0:cols) for r < R; with kPrefetch, also a
  // prefetch (into L2) of row k of the next panel. k runs in blocks of kDepthBlock, each
  // summed in registers and then added into y: the rounding error of one running sum
  // grows with K (at K 1024 about twice at::mm's, which blocks K too).
  template <int R, bool kPrefetch>
  LRNN_WIDE_VECTORS static void tile(const float* a, int64_t lda, const float* panel, int64_t K, float* y, int64_t ldy,
                   int64_t cols, const float* next, bool add) {
    for (int64_t k0 = 0; k0 < K || k0 == 0; k0 += kDepthBlock) {
      const int64_t k1 = std::min(K, k0 + kDepthBlock);
      Vec lo[R], hi[R];
      for (int r = 0; r < R; ++r) lo[r] = hi[r] = Vec{};
      for (int64_t k = k0; k < k1; ++k) {
        if constexpr (kPrefetch) {
          for (int64_t j = 0; j < kWidth; j += 16) __builtin_prefetch(next + k * kWidth + j, 0, 1);  // 64-byte lines
        }
        Vec m0, m1;
        std::memcpy(&m0, panel + k * kWidth, sizeof(Vec));
        std::memcpy(&m1, panel + k * kWidth + kLanes, sizeof(Vec));
#pragma GCC unroll 6
        for (int r = 0; r < R; ++r) {
          const float v = a[r * lda + k];
          lo[r] += m0 * v;
          hi[r] += m1 * v;
        }
      }
      store<R>(lo, hi, y, ldy, cols, add || k0 > 0);
    }
  }

  // y[r][0:cols) = (lo[r], hi[r]), or += with `add` (a later block of k).
  template <int R>
  LRNN_WIDE_VECTORS __attribute__((always_inline)) static void store(Vec* lo, Vec* hi, float* y, int64_t ldy, int64_t cols, bool add) {
    if (cols == kWidth) {  // a whole panel: two unaligned vector stores per row
      for (int r = 0; r < R; ++r) {
        if (add) {
          Vec y0, y1;
          std::memcpy(&y0, y + r * ldy, sizeof(Vec));
          std::memcpy(&y1, y + r * ldy + kLanes, sizeof(Vec));
          lo[r] += y0;
          hi[r] += y1;
        }
        std::memcpy(y + r * ldy, &lo[r], sizeof(Vec));
        std::memcpy(y + r * ldy + kLanes, &hi[r], sizeof(Vec));
      }
      return;
    }
    for (int r = 0; r < R; ++r) {  // the last, partial panel
      float row[kWidth];
      std::memcpy(row, &lo[r], sizeof(Vec));
      std::memcpy(row + kLanes, &hi[r], sizeof(Vec));
      if (add) {
        for (int64_t j = 0; j < cols; ++j) row[j] += y[r * ldy + j];
      }
      std::memcpy(y + r * ldy, row, cols * sizeof(float));
    }
  }
};

}  // namespace lrnn
