// Whether ATen's float32 at::mm runs MKL's generic kernels on this CPU, which decides
// three of the driver's GEMM choices (rnn_gemm.h, rnn_grad_gemms.h).
//
// MKL picks its kernels by CPU vendor: its AVX-512 sgemm runs on Intel CPUs only. On an
// AMD EPYC with AVX-512 (Zen 4) at::mm ran MKL's AVX2 "zen" kernels at 81-97 GFLOP/s,
// where oneDNN (which generates code for the CPU's features) and the panel GEMM ran at
// 97-112. Measured there, 1 thread, ms, 2500 rows (batch 50, T 50), weight (4H x H):
//   weight gradient dG^T x     H 64: 0.92 at::mm / 0.77 oneDNN as (x^T dG)^T
//                              H 128: 3.79 / 3.45;  256: 14.2 / 12.7;  512: 54.2 / 50.2
//   input projection x W_ih^T  H 64: 0.84 at::mm / 0.79 panels;  128: 3.48 / 3.13
//   weight gradients in chunks of 250 rows as they are finished (rnn_grad_gemms.h):
//                              H 128: 3.84 at::mm, against 3.45 for oneDNN after the loop
// LSTM fwd + bwd against torch.nn, batch 50, T 50, interleaved, 1 thread, without / with
// the three choices below: 1x64 1.02-1.05 / 0.96-0.99, 1x128 1.09 / 1.04-1.06, 2x128
// 0.81-0.84 / 0.78-0.80, 3x128 0.83 / 0.80, 1x256 0.93 / 0.89, 1x512 0.99 / 0.95; GRU
// within 0.01. oneDNN's weight gradient was faster than at::mm there at H 8-512 (powers of
// two) and H 96, 200, 384 (not), and 3 % slower at H 32 with input 300 (2.17 / 2.11 ms).
// On Intel CPUs (where the Xeon measurements in rnn_gemm.h were taken) nothing changes,
// nor on CPUs with AVX2 only: on an AMD EPYC with AVX2, oneDNN's weight gradients at sizes
// that are not powers of two had run 1.3-3x longer than MKL's (rnn_gemm.h,
// dnnl_plain_weight_fast), and chunks and panels for the projection were not measured there.
#pragma once

#include <ATen/Context.h>

#include <atomic>
#include <cstdint>

#include <c10/util/Exception.h>

namespace lrnn {

class MklPath {
  static std::atomic<int>& forced() {
    static std::atomic<int> v{-1};
    return v;
  }

  static bool detected() {
    static const bool generic = [] {
      if (!at::globalContext().hasMKL()) return false;  // ATen's BLAS is another library
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
      __builtin_cpu_init();
      return !__builtin_cpu_is("intel") && __builtin_cpu_supports("avx512f");
#else
      return false;  // MKL runs on x86 only
#endif
    }();
    return generic;
  }

 public:
  // True where at::mm runs MKL's generic kernels on a CPU with AVX-512 (ATen built with
  // MKL, an x86 CPU with AVX-512 not made by Intel). There, the driver:
  //  - runs the forward's input projection x W_ih^T on panels (proj_gemm_pooled);
  //  - runs the weight gradients in oneDNN at every size (wgrad_gemm);
  //  - runs the backward's dx / dW GEMMs after the loop, not in chunks (GradChunking).
  static bool generic() {
    const int f = forced().load(std::memory_order_relaxed);
    return f >= 0 ? f == 1 : detected();
  }
  // Tests: act as if generic() were `v` (1 / 0), or detect it again (-1).
  static void force(int v) {
    TORCH_CHECK(v >= -1 && v <= 1, "mkl generic path: expected -1 (detect), 0 or 1, got ", v);
    forced().store(v, std::memory_order_relaxed);
  }
  static bool detected_generic() { return detected(); }
};

}  // namespace lrnn
