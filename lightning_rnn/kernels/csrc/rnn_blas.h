// Whether ATen's float32 at::mm runs MKL's generic kernels on this CPU, which decides
// three of the driver's GEMM choices (rnn_gemm.h, rnn_grad_gemms.h).
//
// MKL picks its kernels by CPU vendor: its AVX-512 sgemm runs on Intel CPUs only. On an
// x86 CPU with AVX-512 from another vendor (e.g. AMD Zen 4) at::mm runs MKL's AVX2
// kernels, while oneDNN (which generates code for the CPU's features) and the panel GEMM
// (rnn_panels.h) use the full width. There both are faster than at::mm for this driver's
// weight gradients (oneDNN, at any size) and input projection (panels), and the weight
// gradients in oneDNN after the loop beat at::mm on chunks of rows during it. The
// layer-level effect is in the benchmark's grid (docs/benchmarks.md).
// On Intel CPUs nothing changes, nor on CPUs with AVX2 only: there oneDNN's weight
// gradients with a plain weight are slow at sizes that are not powers of two (rnn_gemm.h:
// dnnl_plain_weight_fast).
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
