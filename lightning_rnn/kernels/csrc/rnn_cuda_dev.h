// CUDA device policy for the shared driver: one fused pointwise kernel per step
// (forward and backward) and one scan kernel, and the cell options' row kernels (a block
// per row); the GEMMs are ATen's (cuBLAS).
// The kernels live in rnn_cuda_kernels.cu (nvcc); this header is all the driver sees.
#pragma once

#include <cuda_runtime_api.h>

#include "rnn_cells.h"
#include "rnn_options.h"
#include "rnn_options_scan.h"

namespace lrnn {

template <class Cell, typename S, typename A>
void launch_forward_step(const FwdStep<S, A>& s, cudaStream_t stream);
template <class Cell, typename S, typename A>
void launch_scan(const ScanArgs<S, A>& a, int64_t B, cudaStream_t stream);
template <class Cell, typename S, typename A>
void launch_backward_step(const BwdStep<S, A>& s, cudaStream_t stream);

// The cell options' row passes (rnn_options.h): one block per row.
template <class Opts, typename S, typename A>
void launch_options_forward(const OptFwdStep<S, A>& s, cudaStream_t stream);
template <typename S, typename A>
void launch_options_finish(A* h, S* out, S* h_c, A* scratch, const A* rscale, const uint8_t* keep_h, int64_t n,
                           int64_t P, A p_h, cudaStream_t stream);
template <bool kLstm, typename S, typename A>
void launch_options_scan(const OptScanArgs<S, A>& a, int64_t B, cudaStream_t stream);
template <typename S, typename A>
void launch_options_projected_scan(const OptScanArgs<S, A>& a, const S* htil, int64_t B, cudaStream_t stream);
template <class Opts, typename S, typename A>
void launch_options_backward(const OptBwdStep<S, A>& s, cudaStream_t stream);

}  // namespace lrnn
