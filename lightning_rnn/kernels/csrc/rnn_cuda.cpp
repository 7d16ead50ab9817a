// CUDA backend bindings: the shared driver (rnn_driver.h) with the CUDA device policy.
// GEMMs run on cuBLAS through ATen on the current stream; the pointwise kernels are in
// rnn_cuda_kernels.cu.
#include <torch/extension.h>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <utility>

#include "rnn_autograd.h"
#include "rnn_cuda_dev.h"
#include "rnn_driver.h"
#include "rnn_driver_options.h"

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

  // The cell options (rnn_driver_options.h): the row kernels of rnn_cuda_kernels.cu, and
  // the input norm over all tokens' rows as ATen operations.
  template <class Opts, typename S, typename A>
  static void options_forward(const OptFwdStep<S, A>& s) {
    launch_options_forward<Opts, S, A>(s, c10::cuda::getCurrentCUDAStream());
  }
  template <typename S, typename A>
  static void options_finish(A* h, S* out, S* h_c, A* scratch, const A* rscale, const uint8_t* keep_h, int64_t n,
                             int64_t P, A p_h) {
    launch_options_finish<S, A>(h, out, h_c, scratch, rscale, keep_h, n, P, p_h, c10::cuda::getCurrentCUDAStream());
  }
  template <bool kLstm, typename S, typename A>
  static void options_scan(const OptScanArgs<S, A>& a, int64_t B) {
    launch_options_scan<kLstm, S, A>(a, B, c10::cuda::getCurrentCUDAStream());
  }
  template <typename S, typename A>
  static void options_projected_scan(const OptScanArgs<S, A>& a, const S* htil, int64_t B) {
    launch_options_projected_scan<S, A>(a, htil, B, c10::cuda::getCurrentCUDAStream());
  }
  template <class Opts, typename S, typename A>
  static void options_backward(const OptBwdStep<S, A>& s) {
    launch_options_backward<Opts, S, A>(s, c10::cuda::getCurrentCUDAStream());
  }

  template <typename S, typename A>
  static void norm_rows(at::Tensor& v, const at::Tensor& w, const at::Tensor& b) {
    auto [var, mean] = at::var_mean(v, {1}, /*correction=*/0, /*keepdim=*/true);
    v.copy_((v - mean) * (var + kNormEps).rsqrt() * w + b);
  }
  template <typename S, typename A>
  static std::pair<at::Tensor, at::Tensor> norm_rows_backward(const at::Tensor& dy, at::Tensor& a,
                                                              const at::Tensor& w) {
    auto [var, mean] = at::var_mean(a, {1}, /*correction=*/0, /*keepdim=*/true);
    const at::Tensor rstd = (var + kNormEps).rsqrt();
    a.sub_(mean).mul_(rstd);  // a_hat
    const at::Tensor g = dy * w;
    const at::Tensor da = rstd * (g - g.mean(1, true) - a * (g * a).mean(1, true));
    return {da.to(c10::CppTypeToScalarType<S>::value).contiguous(), (dy * a).sum(0)};
  }
};

// Runs an entry point F(x, args...) with x's GPU as the current device. ATen's ops (the
// GEMMs, the allocations) guard their device themselves, but the pointwise kernels are
// launched by hand on getCurrentCUDAStream(): without the guard, a layer on cuda:1 while
// the current device is cuda:0 would have its kernels launched on device 0 (pointers into
// device 1's memory) and on device 0's stream, unordered with the GEMMs on device 1's stream.
template <auto F>
struct OnDeviceOf;

template <class R, class... Args, R (*F)(const at::Tensor&, Args...)>
struct OnDeviceOf<F> {
  static R call(const at::Tensor& x, Args... args) {
    c10::cuda::OptionalCUDAGuard guard;
    if (x.is_cuda()) guard.set_device(x.device());  // else the driver's own check names x
    at::AutoDispatchBelowADInplaceOrView below_autograd;  // as the CPU kernels' (rnn_cpu.cpp: Flushed)
    return F(x, std::forward<Args>(args)...);
  }
};

// What the autograd node's calls run under (rnn_autograd.h): x's GPU, as OnDeviceOf.
struct CudaScope {
  explicit CudaScope(const at::Tensor& x) {
    if (x.is_cuda()) guard.set_device(x.device());
  }
  c10::cuda::OptionalCUDAGuard guard;
};

}  // namespace lrnn

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace lrnn;
  m.doc() = "lightning_rnn fused LSTM/GRU kernels (CUDA)";
  const auto nogil = py::call_guard<py::gil_scoped_release>();  // as the CPU kernels (rnn_cpu.cpp)
  m.def("lstm_forward", &OnDeviceOf<&rnn_forward<LstmCell, CudaDev>>::call, "LSTM forward of one layer-direction", nogil);
  m.def("lstm_backward", &OnDeviceOf<&rnn_backward<LstmCell, CudaDev>>::call, "LSTM backward of one layer-direction",
        nogil);
  m.def("gru_forward", &OnDeviceOf<&rnn_forward<GruCell, CudaDev>>::call, "GRU forward of one layer-direction", nogil);
  m.def("gru_backward", &OnDeviceOf<&rnn_backward<GruCell, CudaDev>>::call, "GRU backward of one layer-direction", nogil);
  def_autograd_entry_points<CudaDev, CudaScope>(m);  // lstm/gru _apply, _stack, _padded
  m.def("lstm_options_forward", &OnDeviceOf<&options_forward_entry<LstmCell, CudaDev>>::call,
        "LSTM forward of one layer-direction with cell options", nogil);
  m.def("lstm_options_backward", &OnDeviceOf<&options_backward_entry<LstmCell, CudaDev>>::call,
        "LSTM backward of one layer-direction with cell options", nogil);
  m.def("gru_options_forward", &OnDeviceOf<&options_forward_entry<GruCell, CudaDev>>::call,
        "GRU forward of one layer-direction with cell options", nogil);
  m.def("gru_options_backward", &OnDeviceOf<&options_backward_entry<GruCell, CudaDev>>::call,
        "GRU backward of one layer-direction with cell options", nogil);
  m.def("lstm_gemm_bound", &OnDeviceOf<&gemm_bound<LstmCell>>::call, "the GEMMs of an LSTM fwd+bwd alone (benchmarks)",
        nogil);
  m.def("gru_gemm_bound", &OnDeviceOf<&gemm_bound<GruCell>>::call, "the GEMMs of a GRU fwd+bwd alone (benchmarks)",
        nogil);
}
