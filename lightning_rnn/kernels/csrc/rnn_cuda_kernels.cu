// The CUDA pointwise kernels: one thread per (row b, column j) of a step; the cell
// math is the same code the CPU backend runs (rnn_cells.h). The cell options' passes run
// a block per row, with rnn_options.h's row math on CudaRowLoop. Instantiated for
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

// ---- the cell options: a block per row (rnn_options.h's row loop) --------------------
constexpr int kRowThreads = 128;  // threads of a row's block: a multiple of the warp size

// The sum of v over the block, to every thread (warp shuffles, then the warps' partial sums).
template <typename A>
__device__ A block_sum(A v) {
  __shared__ double partial[kRowThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = double(v);
  __syncthreads();
  double total = 0;
  for (int w = 0; w < kRowThreads / 32; ++w) total += partial[w];
  __syncthreads();  // partial is reused by the next sum
  return A(total);
}

struct CudaRowLoop {
  template <class F>
  __host__ __device__ void each(int64_t n, F&& f) const {
#if defined(__CUDA_ARCH__)
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) f(j);
    __syncthreads();
#endif
  }
  template <typename A, class F>
  __host__ __device__ A sum(int64_t n, F&& f) const {
#if defined(__CUDA_ARCH__)
    A total = A(0);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) total += f(j);
    return block_sum(total);
#else
    return A(0);
#endif
  }
  template <typename A, class F, class G>
  __host__ __device__ void sum2(int64_t n, F&& f, G&& g, A& total_f, A& total_g) const {
#if defined(__CUDA_ARCH__)
    A a = A(0), b = A(0);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      a += f(j);
      b += g(j);
    }
    total_f = block_sum(a);
    total_g = block_sum(b);
#endif
  }
};

template <class Opts, typename S, typename A>
__global__ void options_forward_kernel(OptFwdStep<S, A> s) {
  Opts::forward(CudaRowLoop{}, s.row(blockIdx.x), s.H, s.P, s.p_c, s.p_h, s.project);
}

template <typename S, typename A>
__global__ void options_finish_kernel(A* h, S* out, S* h_c, A* scratch, const A* rscale, const uint8_t* keep_h,
                                      int64_t P, A p_h) {
  const int64_t b = blockIdx.x;
  finish_projected(CudaRowLoop{}, h + b * P, out + b * P, h_c + b * P, scratch + b * P,
                   rscale ? rscale + b * P : nullptr, keep_h ? keep_h + b * P : nullptr, P, p_h);
}

template <bool kLstm, typename S, typename A>
__global__ void options_scan_kernel(OptScanArgs<S, A> a) {
  options_scan<kLstm>(CudaRowLoop{}, a, blockIdx.x);
}

template <typename S, typename A>
__global__ void options_projected_scan_kernel(OptScanArgs<S, A> a, const S* htil) {
  projected_scan(CudaRowLoop{}, a, htil, blockIdx.x);
}

template <class Opts, typename S, typename A>
__global__ void options_backward_kernel(OptBwdStep<S, A> s) {
  Opts::backward(CudaRowLoop{}, s.row(blockIdx.x), s.H, s.P, s.p_c, s.p_h, s.project);
}

}  // namespace

template <class Opts, typename S, typename A>
void launch_options_forward(const OptFwdStep<S, A>& s, cudaStream_t stream) {
  options_forward_kernel<Opts, S, A><<<static_cast<unsigned>(s.n), kRowThreads, 0, stream>>>(s);
  check_launch("lightning_rnn options_forward_kernel");
}

template <typename S, typename A>
void launch_options_finish(A* h, S* out, S* h_c, A* scratch, const A* rscale, const uint8_t* keep_h, int64_t n,
                           int64_t P, A p_h, cudaStream_t stream) {
  options_finish_kernel<S, A><<<static_cast<unsigned>(n), kRowThreads, 0, stream>>>(h, out, h_c, scratch, rscale,
                                                                                       keep_h, P, p_h);
  check_launch("lightning_rnn options_finish_kernel");
}

template <bool kLstm, typename S, typename A>
void launch_options_scan(const OptScanArgs<S, A>& a, int64_t B, cudaStream_t stream) {
  options_scan_kernel<kLstm, S, A><<<static_cast<unsigned>(B), kRowThreads, 0, stream>>>(a);
  check_launch("lightning_rnn options_scan_kernel");
}

template <typename S, typename A>
void launch_options_projected_scan(const OptScanArgs<S, A>& a, const S* htil, int64_t B, cudaStream_t stream) {
  options_projected_scan_kernel<S, A><<<static_cast<unsigned>(B), kRowThreads, 0, stream>>>(a, htil);
  check_launch("lightning_rnn options_projected_scan_kernel");
}

template <class Opts, typename S, typename A>
void launch_options_backward(const OptBwdStep<S, A>& s, cudaStream_t stream) {
  options_backward_kernel<Opts, S, A><<<static_cast<unsigned>(s.n), kRowThreads, 0, stream>>>(s);
  check_launch("lightning_rnn options_backward_kernel");
}

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

#define LRNN_INSTANTIATE_OPTIONS(S, A)                                                                          \
  template void launch_options_forward<LstmOptions, S, A>(const OptFwdStep<S, A>&, cudaStream_t);             \
  template void launch_options_forward<GruOptions, S, A>(const OptFwdStep<S, A>&, cudaStream_t);              \
  template void launch_options_backward<LstmOptions, S, A>(const OptBwdStep<S, A>&, cudaStream_t);            \
  template void launch_options_backward<GruOptions, S, A>(const OptBwdStep<S, A>&, cudaStream_t);             \
  template void launch_options_finish<S, A>(A*, S*, S*, A*, const A*, const uint8_t*, int64_t, int64_t, A,     \
                                            cudaStream_t);                                                    \
  template void launch_options_scan<true, S, A>(const OptScanArgs<S, A>&, int64_t, cudaStream_t);             \
  template void launch_options_scan<false, S, A>(const OptScanArgs<S, A>&, int64_t, cudaStream_t);            \
  template void launch_options_projected_scan<S, A>(const OptScanArgs<S, A>&, const S*, int64_t, cudaStream_t);

LRNN_INSTANTIATE_OPTIONS(float, float)
LRNN_INSTANTIATE_OPTIONS(double, double)
LRNN_INSTANTIATE_OPTIONS(c10::BFloat16, float)
LRNN_INSTANTIATE_OPTIONS(c10::Half, float)

}  // namespace lrnn
