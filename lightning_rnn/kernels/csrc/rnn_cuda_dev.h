// CUDA device policy for the shared driver: one fused pointwise kernel per step
// (forward and backward) and one scan kernel; the GEMMs are ATen's (cuBLAS).
// The kernels live in rnn_cuda_kernels.cu (nvcc); this header is all the driver sees.
#pragma once

#include <cuda_runtime_api.h>

#include "rnn_cells.h"

namespace lrnn {

template <class Cell, typename S, typename A>
void launch_forward_step(const FwdStep<S, A>& s, cudaStream_t stream);
template <class Cell, typename S, typename A>
void launch_scan(const ScanArgs<S, A>& a, int64_t B, cudaStream_t stream);
template <class Cell, typename S, typename A>
void launch_backward_step(const BwdStep<S, A>& s, cudaStream_t stream);

}  // namespace lrnn
