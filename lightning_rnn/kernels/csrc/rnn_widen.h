// bf16 / fp16 GEMMs on CPUs without a fast low-precision GEMM: run in float32 instead.
//
// Under autocast the kernels' GEMMs take bf16 (or fp16) operands and accumulate in
// float32. ATen runs such a CPU GEMM in oneDNN where oneDNN supports the dtype on the CPU
// (AVX-512 or AMX for bf16; AVX512-FP16 or AMX-FP16 for fp16), and otherwise in a plain
// loop of its own, which on a CPU with AVX2 only is tens to a hundred times slower than
// the float32 GEMM of the same shapes. There, widening the operands to float32 computes
// the same products (a product of two bf16 or two fp16 numbers is exact in float32)
// summed in float32 as the low-precision GEMM does, in a different order; the result is
// rounded back to the low precision as ATen's would be.
// The operands' copies cost a pass over each; W_hh's, read at every step, is made once
// per call (StepGemm). Everything the kernels keep (saved gates, x) stays in the low
// precision, so activation memory is unchanged.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <atomic>

#include <c10/util/Exception.h>

namespace lrnn {

class Widen {
  static std::atomic<int>& forced() {
    static std::atomic<int> v{-1};
    return v;
  }

  // Whether oneDNN runs CPU GEMMs of this dtype here, as ATen reports it (the op ATen's
  // own tests ask); a build without the op has no fast path either.
  static bool asked(const char* op) {
    const auto h = c10::Dispatcher::singleton().findOp({op, ""});
    if (!h) return false;
    try {
      torch::jit::Stack st;
      h->callBoxed(&st);
      return st.at(0).toBool();
    } catch (const std::exception&) {
      return false;
    }
  }

 public:
  static bool native(at::ScalarType t) {
    static const bool bf16 = asked("mkldnn::_is_mkldnn_bf16_supported");
    static const bool fp16 = asked("mkldnn::_is_mkldnn_fp16_supported");
    return t == at::kBFloat16 ? bf16 : t == at::kHalf ? fp16 : true;
  }

  // Whether a GEMM with operands like t runs in float32: a bf16 or fp16 CPU tensor on a
  // CPU without a fast GEMM for its dtype (or everywhere / nowhere, when forced).
  static bool applies(const at::Tensor& t) {
    const at::ScalarType d = t.scalar_type();
    if (!t.device().is_cpu() || (d != at::kBFloat16 && d != at::kHalf)) return false;
    const int f = forced().load(std::memory_order_relaxed);
    return f >= 0 ? f == 1 : !native(d);
  }

  // Tests: widen every low-precision CPU GEMM (1), none (0), or detect again (-1).
  static void force(int v) {
    TORCH_CHECK(v >= -1 && v <= 1, "widen low-precision GEMMs: expected -1 (detect), 0 or 1, got ", v);
    forced().store(v, std::memory_order_relaxed);
  }
};

inline at::Tensor f32(const at::Tensor& t) { return t.to(at::kFloat); }

// out = a b and c += a b (out, c: views into the result, in the operands' dtype), widened
// where Widen::applies.
inline void gemm_out(at::Tensor out, const at::Tensor& a, const at::Tensor& b) {
  if (Widen::applies(a)) {
    out.copy_(at::mm(f32(a), f32(b)));
  } else {
    at::mm_out(out, a, b);
  }
}

inline void gemm_add(at::Tensor c, const at::Tensor& a, const at::Tensor& b) {
  if (Widen::applies(a)) {
    c.add_(at::mm(f32(a), f32(b)));  // summed in float32, rounded once
  } else {
    c.addmm_(a, b);
  }
}

}  // namespace lrnn
