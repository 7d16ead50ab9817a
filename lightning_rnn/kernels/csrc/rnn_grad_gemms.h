// The backward's GEMMs over the rows of dG (N, 4H): the input gradient dx = dG W_ih, the
// weight gradients dW_ih = dG^T x and dW_hh = dG_h^T h_{t-1}.
//
// The backward loop writes dG one step at a time, in reverse. Run after the loop, these
// GEMMs read all of dG back: at batch 50, T 50 that is 2.5 MB at hidden 64 and 5 MB at
// 128 (N x 4H floats), more than a core's L2 on common CPUs, so they read it from L3. On
// one CPU thread they run instead on chunks of at least kGradChunkRows rows, each as soon
// as the loop has written it (still in L2), with the weight gradients summed over the
// chunks in place. The chunks' smaller GEMMs take the same time as the whole ones (the
// GEMM-only bound, which runs the same chunks, shows it), so what the layer gains is dG
// found in L2; the benchmark's grid (docs/benchmarks.md) measures the layer with them. A
// dG of at most kGradChunkMinBytes (half of a 2 MB L2) is still in cache when the loop
// ends, so its GEMMs run after the loop.
// No chunks:
//  - on several threads: the GEMMs split across the cores' L2s, and the chunks' smaller
//    GEMMs split less well;
//  - where at::mm runs MKL's generic kernels (rnn_blas.h): the weight gradients after the
//    loop run in oneDNN there, faster than at::mm on chunks;
//  - in mixed precision: chunked sums round differently, and under bf16 / fp16 autocast a
//    weight gradient summed in the compute dtype would lose bits at every chunk.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Optional.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "rnn_gemm.h"

namespace lrnn {

// dG columns [col, col + width) pair with W_ih rows [row, row + width) (Layout<Cell>).
struct GradBlock {
  int64_t col, width, row;
};

constexpr int64_t kGradChunkRows = 256;
constexpr int64_t kGradChunkMinBytes = int64_t(1) << 20;

class GradChunking {
  static std::atomic<int64_t>& forced() {
    static std::atomic<int64_t> rows{-1};
    return rows;
  }

 public:
  // Rows per chunk for a backward with dG of N rows of row_bytes each (0: one pass after
  // the loop). cpu_one_precision: a CPU call whose compute and state dtypes agree, with no
  // projection (whose dW_hh needs h_t, rebuilt after the loop).
  static int64_t rows(bool cpu_one_precision, int64_t N, int64_t row_bytes) {
    if (!cpu_one_precision) return 0;
    const int64_t f = forced().load(std::memory_order_relaxed);
    if (f >= 0) return f;
    return at::get_num_threads() == 1 && N * row_bytes > kGradChunkMinBytes && !MklPath::generic() ? kGradChunkRows
                                                                                                    : 0;
  }
  // Tests: chunks of exactly this many rows (rounded up to whole steps) wherever chunks are
  // allowed, 0 for one pass after the loop, -1 for the automatic choice above.
  static void force(int64_t rows) {
    TORCH_CHECK(rows >= -1, "grad chunk rows: expected -1 (automatic), 0 (off) or a positive count, got ", rows);
    forced().store(rows, std::memory_order_relaxed);
  }
  static int64_t forced_rows() { return forced().load(std::memory_order_relaxed); }
};

// The GEMMs of one backward over dG (N, 4H) for the gradients asked for. dw_ih_into /
// dw_hh_into: running sums the weight gradients are added into (gradient checkpointing),
// else fresh tensors. Call rows_done for each step's rows as the loop finishes them (the
// loop visits the steps in order, so consecutive calls' rows are adjacent), then finish.
class GradGemms {
 public:
  GradGemms(std::vector<GradBlock> blocks, const at::Tensor& dG, int64_t HG, const at::Tensor& x_c,
            const at::Tensor& w_ih_c, const at::Tensor& h_prev, bool want_dx, bool want_dw_ih, bool want_dw_hh,
            const c10::optional<at::Tensor>& dw_ih_into, const c10::optional<at::Tensor>& dw_hh_into,
            int64_t chunk_rows)
      : blocks_(std::move(blocks)), dG_(dG), HG_(HG), x_(x_c), w_ih_(w_ih_c), h_prev_(h_prev),
        want_dx_(want_dx), want_dw_ih_(want_dw_ih), want_dw_hh_(want_dw_hh), sum_ih_(dw_ih_into.has_value()),
        sum_hh_(dw_hh_into.has_value()), chunk_rows_(chunk_rows), lo_(dG.size(0)), left_(dG.size(0)) {
    if (sum_ih_) dw_ih = *dw_ih_into;
    if (sum_hh_) dw_hh = *dw_hh_into;
    if (chunk_rows_ == 0) return;
    if (want_dx_) dx = at::empty({dG.size(0), x_c.size(1)}, dG.options());
    // Fresh weight gradients are written by the first chunk, not zero-filled and summed into
    // (N >= 1, as the bindings check, so a first chunk always comes).
    if (want_dw_ih_ && !sum_ih_) dw_ih = at::empty_like(w_ih_c);
    if (want_dw_hh_ && !sum_hh_) dw_hh = at::empty({HG, h_prev.size(1)}, dG.options());
  }

  // A chunk is flushed once it has chunk_rows rows, unless fewer than half that many rows
  // would be left for the last one: those join it (no short, slow GEMMs at the end; a
  // checkpointed chunk of 7 steps of 50 rows is one GEMM chunk, not 300 + 50 rows).
  void rows_done(int64_t off, int64_t n) {
    if (chunk_rows_ == 0) return;
    lo_ = std::min(lo_, off);
    hi_ = std::max(hi_, off + n);
    left_ -= n;
    if (hi_ - lo_ >= chunk_rows_ && 2 * left_ >= chunk_rows_) flush();
  }

  // h_{t-1} for dW_hh given late: a projected LSTM's, rebuilt after the loop (its calls
  // run without chunks, as rows() says).
  void set_h_prev(const at::Tensor& h_prev) {
    TORCH_CHECK(chunk_rows_ == 0, "GradGemms: h_prev given after the loop to a chunked backward");
    h_prev_ = h_prev;
  }

  // The remaining rows; then dx, dw_ih, dw_hh hold the gradients asked for.
  void finish() {
    if (chunk_rows_) {
      flush();
    } else {
      whole();
    }
  }

  at::Tensor dx, dw_ih, dw_hh;

 private:
  // Rows [lo_, hi_) of every gradient: dx's rows written, the weight gradients summed.
  void flush() {
    if (hi_ <= lo_) return;
    const int64_t r = hi_ - lo_;
    const at::Tensor dGr = dG_.narrow(0, lo_, r);
    bool first = true;
    for (const GradBlock& g : blocks_) {
      const at::Tensor dGb = dGr.narrow(1, g.col, g.width);
      // dx's rows: the first block writes them, the others add; in at::mm, not on panels,
      // as chunks run where MKL runs its own kernels (rows(); rnn_gemm.h: input_grad_gemm)
      if (want_dx_) accumulate(dx.narrow(0, lo_, r), dGb, w_ih_.narrow(0, g.row, g.width), first);
      if (want_dw_ih_) {
        accumulate(dw_ih.narrow(0, g.row, g.width), dGb.t(), x_.narrow(0, lo_, r), first_chunk_ && !sum_ih_);
      }
      first = false;
    }
    if (want_dw_hh_) accumulate(dw_hh, dGr.narrow(1, 0, HG_).t(), h_prev_.narrow(0, lo_, r), first_chunk_ && !sum_hh_);
    first_chunk_ = false;
    lo_ = dG_.size(0);
    hi_ = 0;
  }

  // sum += a b, or sum = a b where `write` (the first chunk into a fresh, unset gradient).
  static void accumulate(at::Tensor sum, const at::Tensor& a, const at::Tensor& b, bool write) {
    if (write) {
      gemm_out(sum, a, b);
    } else {
      gemm_add(sum, a, b);
    }
  }

  // All rows at once, after the loop (rnn_gemm.h picks each GEMM's library).
  void whole() {
    if (want_dx_ || want_dw_ih_) {
      if (want_dw_ih_ && !sum_ih_) dw_ih = at::empty_like(w_ih_);
      for (const GradBlock& g : blocks_) {
        const at::Tensor dGb = dG_.narrow(1, g.col, g.width);  // (N, width)
        if (want_dx_) {
          const at::Tensor w = w_ih_.narrow(0, g.row, g.width);  // (width, I)
          if (dx.defined()) {
            gemm_add(dx, dGb, w);
          } else {
            dx = input_grad_gemm(dGb, w, w_ih_);
          }
        }
        if (want_dw_ih_) {
          at::Tensor dw = dw_ih.narrow(0, g.row, g.width);
          if (sum_ih_) {
            gemm_add(dw, dGb.t(), x_);
          } else if (dGb.is_contiguous() && g.width == dw_ih.size(0)) {
            dw_ih = wgrad_gemm(dGb, x_);  // one block covering all of W_ih (LSTM)
          } else {
            gemm_out(dw, dGb.t(), x_);
          }
        }
      }
    }
    if (want_dw_hh_) {
      const at::Tensor dG_h = dG_.narrow(1, 0, HG_);
      if (sum_hh_) {
        gemm_add(dw_hh, dG_h.t(), h_prev_);
      } else {
        dw_hh = wgrad_gemm(dG_h, h_prev_);
      }
    }
  }

  const std::vector<GradBlock> blocks_;
  const at::Tensor dG_;
  const int64_t HG_;
  const at::Tensor x_, w_ih_;
  at::Tensor h_prev_;
  const bool want_dx_, want_dw_ih_, want_dw_hh_, sum_ih_, sum_hh_;
  const int64_t chunk_rows_;
  int64_t lo_, hi_ = 0;  // rows done and not yet multiplied
  int64_t left_;         // rows the loop has not done yet
  bool first_chunk_ = true;  // no chunk flushed yet
};

}  // namespace lrnn
