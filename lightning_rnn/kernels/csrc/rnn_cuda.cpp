// CUDA backend bindings: the shared driver (rnn_driver.h) with the CUDA device policy.
// GEMMs run on cuBLAS through ATen on the current stream; the pointwise kernels are in
// rnn_cuda_kernels.cu.
#include <torch/extension.h>

#include <c10/cuda/CUDAStream.h>

#include "rnn_cuda_dev.h"
#include "rnn_driver.h"

namespace lrnn {

struct CudaDev {
  static constexpr c10::DeviceType kDevice = c10::DeviceType::CUDA;
  // cuBLAS accumulates h W_hh^T into pre's rows in place (beta = 1): no hw buffer.
  static constexpr bool kStepIntoPre = true;

  template <class Cell, typename S, typename A>
  static void forward_step(const FwdStep<S, A>& s) {
    launch_forward_step<Cell, S, A>(s, c10::cuda::getCurrentCUDAStream());
  }
  template <class Cell, typename S, typename A>
  static void scan(const ScanArgs<S, A>& a, int64_t B) {
    launch_scan<Cell, S, A>(a, B, c10::cuda::getCurrentCUDAStream());
  }
  template <class Cell, typename S, typename A>
  static void backward_step(const BwdStep<S, A>& s) {
    launch_backward_step<Cell, S, A>(s, c10::cuda::getCurrentCUDAStream());
  }
};

}  // namespace lrnn

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace lrnn;
  m.doc() = "lightning_rnn fused LSTM/GRU kernels (CUDA)";
  m.def("lstm_forward", &rnn_forward<LstmCell, CudaDev>, "LSTM forward of one layer-direction");
  m.def("lstm_backward", &rnn_backward<LstmCell, CudaDev>, "LSTM backward of one layer-direction");
  m.def("gru_forward", &rnn_forward<GruCell, CudaDev>, "GRU forward of one layer-direction");
  m.def("gru_backward", &rnn_backward<GruCell, CudaDev>, "GRU backward of one layer-direction");
  m.def("lstm_gemm_bound", &gemm_bound<LstmCell>, "the GEMMs of an LSTM fwd+bwd alone (benchmarks)");
  m.def("gru_gemm_bound", &gemm_bound<GruCell>, "the GEMMs of a GRU fwd+bwd alone (benchmarks)");
}
