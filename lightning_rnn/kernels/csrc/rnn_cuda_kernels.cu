// The CUDA pointwise kernels: one thread per (row b, column j) of a step; the cell
// math is the same code the CPU backend runs (rnn_cells.h). Instantiated for
// LSTM/GRU x (float, float), (double, double), (bf16, float), (fp16, float).
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <stdexcept>
#include <string>

#include "rnn_cuda_dev.h"

namespace lrnn {
namespace {

constexpr int kThreads = 256;

inline unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

inline void check_launch(const char* what) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

template <class Cell, bool kHw, typename S, typename A>
__global__ void forward_kernel(FwdStep<S, A> s) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= s.n * s.H) return;
  const int64_t b = idx / s.H, j = idx % s.H;
  Cell::template forward<kHw>(s.row(b), s.H, j);
}

template <class Cell, typename S, typename A>
__global__ void scan_kernel(ScanArgs<S, A> a, int64_t B) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= B * a.H) return;
  const int64_t b = idx / a.H, j = idx % a.H;
  scan_tokens<Cell>(a, b, [&](const ScanRow<S, A>& r, const A* h0, S* h_prev_c, bool first) {
    if (first) h_prev_c[j] = S(h0[j]);
    Cell::scan(r, a.H, j);
  });
}

template <class Cell, bool kDhIn, typename S, typename A>
__global__ void backward_kernel(BwdStep<S, A> s) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= s.n * s.H) return;
  const int64_t b = idx / s.H, j = idx % s.H;
  Cell::template backward<kDhIn>(s.row(b), s.H, j);
}

}  // namespace

template <class Cell, typename S, typename A>
void launch_forward_step(const FwdStep<S, A>& s, cudaStream_t stream) {
  if constexpr (Cell::kHwInPre) {
    if (!s.hw) {
      forward_kernel<Cell, false, S, A><<<blocks_for(s.n * s.H), kThreads, 0, stream>>>(s);
      return check_launch("lightning_rnn forward_kernel");
    }
  }
  forward_kernel<Cell, true, S, A><<<blocks_for(s.n * s.H), kThreads, 0, stream>>>(s);
  check_launch("lightning_rnn forward_kernel");
}

template <class Cell, typename S, typename A>
void launch_scan(const ScanArgs<S, A>& a, int64_t B, cudaStream_t stream) {
  scan_kernel<Cell, S, A><<<blocks_for(B * a.H), kThreads, 0, stream>>>(a, B);
  check_launch("lightning_rnn scan_kernel");
}

template <class Cell, typename S, typename A>
void launch_backward_step(const BwdStep<S, A>& s, cudaStream_t stream) {
  if (s.dh_in) {
    backward_kernel<Cell, true, S, A><<<blocks_for(s.n * s.H), kThreads, 0, stream>>>(s);
  } else {
    backward_kernel<Cell, false, S, A><<<blocks_for(s.n * s.H), kThreads, 0, stream>>>(s);
  }
  check_launch("lightning_rnn backward_kernel");
}

#define LRNN_INSTANTIATE(CELL, S, A)                                                        \
  template void launch_forward_step<CELL, S, A>(const FwdStep<S, A>&, cudaStream_t);        \
  template void launch_scan<CELL, S, A>(const ScanArgs<S, A>&, int64_t, cudaStream_t);      \
  template void launch_backward_step<CELL, S, A>(const BwdStep<S, A>&, cudaStream_t);

#define LRNN_INSTANTIATE_CELL(CELL)                \
  LRNN_INSTANTIATE(CELL, float, float)             \
  LRNN_INSTANTIATE(CELL, double, double)           \
  LRNN_INSTANTIATE(CELL, c10::BFloat16, float)     \
  LRNN_INSTANTIATE(CELL, c10::Half, float)

LRNN_INSTANTIATE_CELL(LstmCell)
LRNN_INSTANTIATE_CELL(GruCell)

}  // namespace lrnn
