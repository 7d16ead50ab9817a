// oneDNN matmul for the float32 CPU GEMMs of the driver, with a clean fallback to ATen.
//
// On CPU, at::mm runs MKL's sgemm. For the GEMM shapes of an RNN layer, oneDNN's matmul
// (the op inductor emits on CPU: mkldnn::_linear_pointwise, with weights pre-packed by
// mkldnn::_reorder_linear_weight) is faster at large hidden sizes, most of all with a
// weight packed once into its blocked layout and reused. Where the driver uses it:
//   per step  h W_hh^T with W_hh packed, from hidden kDnnlMinDim (below it the call's
//             overhead outweighs the gain); steps of up to 64 rows run on panels instead
//             (rnn_panels.h, StepGemm below);
//   dG W_ih   the input gradient, with the plain strided weight;
//   dG^T x    the weight gradients, as (x^T dG)^T: x^T copied contiguous, dG^T a view,
//             the result transposed back to the weight's layout (rnn_transpose.h).
// Those two unpacked-weight GEMMs are slow in oneDNN at sizes that are not powers of two
// (dnnl_plain_weight_fast), which then use at::mm. The forward's x W_ih^T runs in at::mm
// into a pooled buffer (proj_gemm_pooled).
// The ops are looked up in the dispatcher at run time (boxed calls, no link-time
// dependency); where they are missing or fail, DnnlGemm::ok() turns false for the
// process and the callers use at::mm. float32 only: oneDNN has no float64 matmul, and
// the float64 path is the parity path.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "rnn_blas.h"
#include "rnn_panels.h"
#include "rnn_pool.h"
#include "rnn_transpose.h"
#include "rnn_widen.h"

namespace lrnn {

// Packed copies of weights kept for reuse while the store is active on a thread.
//
// Gradient checkpointing runs a layer in chunks of a few steps, each chunk a separate
// kernel call (twice: forward, then recomputed in backward). Packing W_ih and W_hh at
// every call is a pass over each weight, which for chunks of a few steps costs as much as
// the packed GEMMs gain. While a store is active (Python: `with store:`), DnnlGemm::pack
// returns the copy made earlier for the same weight at the same version. The store holds strong
// references to the weights it packed (so their storage cannot be reused by another
// tensor) and is emptied by clear(); the Python owner clears it when a pass over the
// chunks ends.
class WeightPacks {
 public:
  // The store active on this thread, or nullptr.
  static WeightPacks*& current() {
    thread_local WeightPacks* active = nullptr;
    return active;
  }
  // The store active before, kept per thread like current(): threads may enter one store
  // at once (the kernels run without the GIL), and each gets its own outer store back.
  void enter() {
    outer().push_back(current());
    current() = this;
  }
  void exit() {
    TORCH_CHECK(!outer().empty() && current() == this, "WeightPacks: exit without a matching enter on this thread");
    current() = outer().back();
    outer().pop_back();
  }
  void clear() {
    std::lock_guard<std::mutex> lock(m_);
    entries_.clear();
  }
  int64_t size() {
    std::lock_guard<std::mutex> lock(m_);
    return static_cast<int64_t>(entries_.size());
  }
  // The packed copy of w made by pack(w) earlier, else pack(w). "The same weight": the
  // same view (storage, offset, sizes, strides) at the same version. Tensors, not
  // TensorImpls, are compared: the backward of a checkpointed chunk sees new detached
  // views of the saved weights, which share storage and version counter.
  // `kind` tells apart the layouts one view is packed into (oneDNN's, panels).
  // The version is base's, the weight as the kernel was given it: w is often a view made
  // inside the kernels, whose ATen calls run below autograd's view tracking (rnn_cpu.cpp:
  // Flushed), so that it has a version counter of its own, which an in-place change of
  // the weight does not bump.
  template <class Pack>
  at::Tensor get(const at::Tensor& w, const at::Tensor& base, int kind, Pack pack) {
    std::lock_guard<std::mutex> lock(m_);
    const int64_t version = base._version();
    for (const Entry& e : entries_) {
      if (e.kind == kind && e.version == version && same_view(e.source, w)) return e.packed;
    }
    at::Tensor packed = pack(w);
    entries_.push_back({w, kind, version, packed});
    return packed;
  }

 private:
  static std::vector<WeightPacks*>& outer() {
    thread_local std::vector<WeightPacks*> stores;
    return stores;
  }
  static bool same_view(const at::Tensor& a, const at::Tensor& b) {
    return a.storage().unsafeGetStorageImpl() == b.storage().unsafeGetStorageImpl() &&
           a.storage_offset() == b.storage_offset() && a.sizes() == b.sizes() && a.strides() == b.strides() &&
           a.scalar_type() == b.scalar_type();
  }
  struct Entry {
    at::Tensor source;
    int kind;
    int64_t version;
    at::Tensor packed;
  };
  std::mutex m_;
  std::vector<Entry> entries_;
};

class DnnlGemm {
 public:
  static constexpr int kKind = 0;  // WeightPacks kind
  // Whether the oneDNN path may be used for tensors like t (float32 on CPU, op present,
  // not disabled with LIGHTNING_RNN_NO_DNNL=1, no earlier failure).
  static bool usable(const at::Tensor& t) {
    return t.device().is_cpu() && t.scalar_type() == at::kFloat && ok();
  }

  static bool ok() {
    static const bool present = [] {
      const char* env = std::getenv("LIGHTNING_RNN_NO_DNNL");
      if (env && env[0] && env[0] != '0') return false;
      return linear_op().has_value() && reorder_op().has_value();
    }();
    return present && !failed().load(std::memory_order_relaxed);
  }

  // w (out, in) -> a packed copy for X W^T with about `rows` rows of X, or w itself if
  // packing fails (the plain weight works with linear() too, or with at::mm).
  // Inside an active WeightPacks store, a weight packed before is not packed again.
  // base: the weight w is a view of, as the kernel was given it (WeightPacks::get).
  static at::Tensor pack(const at::Tensor& w, int64_t rows, const at::Tensor& base) {
    if (WeightPacks* store = WeightPacks::current()) {
      return store->get(w, base, kKind, [rows](const at::Tensor& v) { return pack_now(v, rows); });
    }
    return pack_now(w, rows);
  }
  // The same, never kept in a store (a weight made for one call).
  static at::Tensor pack_unstored(const at::Tensor& w, int64_t rows) { return pack_now(w, rows); }

  // x (M, in) @ w^T, w (out, in) plain (any strides) or packed by pack(). Returns an
  // undefined tensor on failure (callers then fall back to at::mm and ok() is false).
  static at::Tensor linear(const at::Tensor& x, const at::Tensor& w) {
    try {
      torch::jit::Stack st{c10::IValue(x), c10::IValue(w), c10::IValue(), c10::IValue(std::string("none")),
                           c10::IValue(c10::List<std::optional<at::Scalar>>()), c10::IValue(std::string(""))};
      linear_op()->callBoxed(&st);
      return st[0].toTensor();
    } catch (const std::exception&) {
      failed() = true;
      return at::Tensor();
    }
  }

 private:
  static at::Tensor pack_now(const at::Tensor& w, int64_t rows) {
    try {
      torch::jit::Stack st{c10::IValue(w.contiguous()), c10::IValue(rows)};
      reorder_op()->callBoxed(&st);
      return st[0].toTensor();
    } catch (const std::exception&) {
      failed() = true;
      return w;
    }
  }

  static std::atomic<bool>& failed() {
    static std::atomic<bool> f{false};
    return f;
  }
  static const std::optional<c10::OperatorHandle>& linear_op() {
    static const std::optional<c10::OperatorHandle> h =
        c10::Dispatcher::singleton().findOp({"mkldnn::_linear_pointwise", ""});
    return h;
  }
  static const std::optional<c10::OperatorHandle>& reorder_op() {
    static const std::optional<c10::OperatorHandle> h =
        c10::Dispatcher::singleton().findOp({"mkldnn::_reorder_linear_weight", ""});
    return h;
  }
};

// Smallest K and N (in, out of the weight) for which oneDNN beats at::mm: the two are even
// at 128 and oneDNN is faster from 256, so the cut lies between.
constexpr int64_t kDnnlMinDim = 192;
// Smallest H for which the backward's per-step dG_h W_hh of steps wider than the panels
// take (kPanelMaxRows) runs in oneDNN with W_hh^T packed once per call rather than in
// addmm_: below it the packing (a pass over W_hh per call) costs more than oneDNN's GEMM
// saves over 50 steps; from 1024 the packed GEMM wins with the packing included.
constexpr int64_t kDnnlBackwardMinDim = 1024;
// Fewest steps for which packing W_hh once (for oneDNN or into panels) pays for itself.
constexpr int64_t kDnnlPackMinSteps = 8;

// Whether a weight for `steps` steps (or `rows` rows) is worth packing: always when an
// active WeightPacks store makes the packing free after the first call.
inline bool worth_packing(int64_t count, int64_t minimum) {
  return count >= minimum || WeightPacks::current() != nullptr;
}

// Whether oneDNN is fast with an unpacked (transposed-view) weight of these dimensions, as
// the backward's dx and weight-gradient GEMMs use it: only at powers of two. At other
// sizes (e.g. hidden 384, 768, 1280) its weight gradient takes up to about three times
// MKL's time. Packed weights, as in the forward, show no such dips.
inline bool dnnl_plain_weight_fast(int64_t rows, int64_t cols) {
  const auto pow2 = [](int64_t v) { return v > 0 && (v & (v - 1)) == 0; };
  return pow2(rows) && pow2(cols);
}

// Smallest dimensions of a weight that proj_gemm's x W^T (M >= 512 rows, e.g. a projected
// LSTM's h = r W_hr^T) runs in oneDNN packed. Alone, the packed GEMM is faster than
// at::mm at every size; inside a layer's forward + backward the packing and the fresh
// result pay for themselves from 128, not at 64.
constexpr int64_t kDnnlPackedMinDim = 128;

// x (M, K) @ w^T for w (N, K) (any strides): oneDNN where usable and big enough, with the
// weight packed first when `pack` and M is large enough to pay for the packing (unpacked
// only at the sizes where that is fast); else at::mm.
inline at::Tensor proj_gemm(const at::Tensor& x, const at::Tensor& w, bool pack = true) {
  if (Widen::applies(x)) return proj_gemm(f32(x), f32(w), /*pack=*/false).to(x.scalar_type());
  if (DnnlGemm::usable(x) && x.size(0) >= 64) {
    const bool packed = pack && worth_packing(x.size(0), 512) && w.size(0) >= kDnnlPackedMinDim &&
                        w.size(1) >= kDnnlPackedMinDim;
    const bool plain = w.size(0) >= kDnnlMinDim && w.size(1) >= kDnnlMinDim &&
                       dnnl_plain_weight_fast(w.size(0), w.size(1));
    if (packed || plain) {
      at::Tensor y = DnnlGemm::linear(x, packed ? DnnlGemm::pack(w, x.size(0), w) : w);
      if (y.defined()) return y;
    }
  }
  return at::mm(x, w.t());
}

// M (K, N) copied into panels (rnn_panels.h), once per pass inside an active WeightPacks
// store; base: the weight M is a view of, as the kernel was given it (WeightPacks::get).
inline at::Tensor panels_of(const at::Tensor& m, const at::Tensor& base) {
  constexpr int kPanelKind = 1;  // WeightPacks kind (oneDNN's is DnnlGemm::kKind)
  WeightPacks* store = WeightPacks::current();
  return store ? store->get(m, base, kPanelKind, [](const at::Tensor& v) { return PanelGemm::pack(v); })
               : PanelGemm::pack(m);
}

// Deepest GEMM (K) the panels take outside the per-step GEMMs, where MKL runs its generic
// kernels (rnn_blas.h): dG W_ih (input_grad_gemm, K = dG's columns) and x W_ih^T (K =
// input size). Up to this depth the panels beat the generic at::mm and oneDNN with the
// unpacked weight; at K 2048 oneDNN is as fast. With MKL's own AVX-512 kernels (Intel
// CPUs) at::mm is faster than the panels, which are therefore not used there.
constexpr int64_t kPanelMaxDepth = 1024;

// x (M, K) @ w^T into a block of BufferPool, for results that stay inside the kernels (the
// forward's x W_ih^T, which become the saved gates): at::mm, since oneDNN allocates its
// results itself, and a fresh result's pages fault in at every call, which costs what its
// packed GEMM gains. Where at::mm runs MKL's generic kernels (rnn_blas.h), panels of
// W_ih^T instead.
inline at::Tensor proj_gemm_pooled(const at::Tensor& x, const at::Tensor& w) {
  at::Tensor y = BufferPool::empty({x.size(0), w.size(0)}, x.options());
  if (Widen::applies(x)) {  // into a pooled float32 block (a fresh one faults its pages in)
    at::Tensor yf = BufferPool::empty({x.size(0), w.size(0)}, x.options().dtype(at::kFloat));
    return y.copy_(at::mm_out(yf, f32(x), f32(w).t()));
  }
  if (MklPath::generic() && PanelGemm::enabled() && PanelGemm::supports(x) && x.stride(1) == 1 &&
      x.size(1) <= kPanelMaxDepth && worth_packing(x.size(0), 64)) {
    PanelGemm::run(x, panels_of(w.t(), w), w.size(0), y);
    return y;
  }
  return at::mm_out(y, x, w.t());
}

// The weight gradient dG^T x (out, in) for dG (M, out), x (M, in), summed over the M rows:
// oneDNN as (x^T dG)^T where usable, over at least 512 rows of a contiguous dG, at sizes
// that are big and fast (or any size where at::mm runs MKL's generic kernels: rnn_blas.h);
// else at::mm.
inline at::Tensor wgrad_gemm(const at::Tensor& dG, const at::Tensor& x) {
  if (Widen::applies(dG)) return wgrad_gemm(f32(dG).contiguous(), f32(x)).to(dG.scalar_type());
  const bool dnnl_sizes = MklPath::generic() || (dG.size(1) >= kDnnlMinDim && x.size(1) >= kDnnlMinDim &&
                                                 dnnl_plain_weight_fast(dG.size(1), x.size(1)));
  if (DnnlGemm::usable(x) && dG.is_contiguous() && x.size(0) >= 512 && dnnl_sizes) {
    at::Tensor y = DnnlGemm::linear(transposed(x), dG.t());  // (in, out)
    if (y.defined()) return transposed(y);
  }
  return at::mm(dG.t(), x);
}

// The input gradient dG (M, K) @ w (K, I) for a dG block with unit column stride: where
// MKL runs its generic kernels, panels where K is small enough and M large enough to pay
// for copying w (a pass over w against M of them); else oneDNN (contiguous dG, fast sizes)
// or at::mm.
inline at::Tensor input_grad_gemm(const at::Tensor& dG, const at::Tensor& w, const at::Tensor& base) {
  if (Widen::applies(dG)) return proj_gemm(f32(dG).contiguous(), f32(w).t(), /*pack=*/false).to(dG.scalar_type());
  if (MklPath::generic() && PanelGemm::enabled() && PanelGemm::supports(dG) && dG.size(1) <= kPanelMaxDepth &&
      dG.stride(1) == 1 && worth_packing(dG.size(0), 64)) {
    at::Tensor y = at::empty({dG.size(0), w.size(1)}, dG.options());
    PanelGemm::run(dG, panels_of(w, base), w.size(1), y);
    return y;
  }
  return dG.is_contiguous() ? proj_gemm(dG, w.t(), /*pack=*/false) : at::mm(dG, w);
}

// The recurrent GEMM of one step, y (n, N) = a (n, K) M, with M prepared once per call for
// the fastest path at the call's sizes: panels (rnn_panels.h) for steps of up to
// kPanelMaxRows rows (with AVX-512, of an M that fits in L2: PanelGemm::suits), else
// oneDNN with M packed where that pays, else ATen. Inside an active WeightPacks store, M
// is prepared once per pass over the chunks.
class StepGemm {
 public:
  enum class Kind { kAten, kDnnl, kPanels };

  // Forward: h W_hh^T, M = w_hh^T for w_hh (G*H, H) in the compute dtype.
  static StepGemm forward(const at::Tensor& w_hh, int64_t B, int64_t T) {
    return prepare(w_hh, w_hh.t(), kDnnlMinDim, B, T);
  }

  // Backward: dG_h W_hh, M = the first HG rows of w_hh (G*H, H) in the compute dtype.
  static StepGemm backward(const at::Tensor& w_hh, int64_t HG, int64_t B, int64_t T) {
    return prepare(w_hh, w_hh.narrow(0, 0, HG), kDnnlBackwardMinDim, B, T);
  }

  Kind kind() const { return kind_; }
  const at::Tensor& plain() const { return plain_; }  // M (K, N) as a view

  // y (n, N) = a (n, K) M on panels for rows given by pointer (row strides lda, ldy):
  // the loops' per-step calls, without the two or three tensor views per step that run()
  // takes (each a dispatcher call that allocates a TensorImpl, several per step of every
  // forward and backward). Returns false, doing nothing, where M is not in panels (then run()).
  template <typename S>
  bool run_rows(const S* a, int64_t lda, int64_t n, S* y, int64_t ldy) const {
    if constexpr (std::is_same_v<S, float>) {
      if (kind_ != Kind::kPanels) return false;
      PanelGemm::run_rows(a, lda, n, prepared_, plain_.size(1), y, ldy);
      return true;
    } else {
      return false;
    }
  }

  // y = a M: written into `out` (n, N), except by oneDNN, which returns a fresh tensor.
  at::Tensor run(const at::Tensor& a, at::Tensor out) const {
    if (widened_) {  // M in float32: a (n, K) and y in float32, y rounded into out
      return out.copy_(StepGemm(kind_, plain_, prepared_).run(f32(a), at::empty(out.sizes(), prepared_.options())));
    }
    if (kind_ == Kind::kPanels) {
      PanelGemm::run(a, prepared_, plain_.size(1), out);
      return out;
    }
    if (kind_ == Kind::kDnnl) {
      at::Tensor y = DnnlGemm::linear(a, prepared_);
      if (y.defined()) return y;
    }
    return at::mm_out(out, a, plain_);
  }

 private:
  // M (K, N) for T steps of up to B rows: panels, else oneDNN (M^T packed) from hidden
  // size dnnl_min_h, else ATen; packing only where T steps pay for it (or a store is active).
  // A bf16 / fp16 M where such GEMMs are slow (rnn_widen.h): copied to float32 once per
  // call and prepared as a float32 M, packed outside any WeightPacks store (the copy is
  // new at every call, so a store would only collect them).
  static StepGemm prepare(const at::Tensor& w_hh, const at::Tensor& m, int64_t dnnl_min_h, int64_t B, int64_t T) {
    if (Widen::applies(m)) {
      const at::Tensor mf = f32(m);
      StepGemm g = prepare(mf, mf, dnnl_min_h, B, T, /*store=*/false);
      g.widened_ = true;
      return g;
    }
    return prepare(w_hh, m, dnnl_min_h, B, T, /*store=*/true);
  }

  static StepGemm prepare(const at::Tensor& w_hh, const at::Tensor& m, int64_t dnnl_min_h, int64_t B, int64_t T,
                          bool store) {
    if (!(store ? worth_packing(T, kDnnlPackMinSteps) : T >= kDnnlPackMinSteps)) return {Kind::kAten, m, m};
    if (PanelGemm::usable(w_hh, B) && PanelGemm::suits(m)) {
      return {Kind::kPanels, m, store ? panels_of(m, w_hh) : PanelGemm::pack(m)};
    }
    if (DnnlGemm::usable(w_hh) && w_hh.size(1) >= dnnl_min_h) {
      return {Kind::kDnnl, m, store ? DnnlGemm::pack(m.t(), B, w_hh) : DnnlGemm::pack_unstored(m.t(), B)};
    }
    return {Kind::kAten, m, m};
  }

  StepGemm(Kind kind, at::Tensor plain, at::Tensor prepared)
      : kind_(kind), plain_(std::move(plain)), prepared_(std::move(prepared)) {}

  Kind kind_;
  at::Tensor plain_, prepared_;
  bool widened_ = false;  // M (plain_, prepared_) in float32 for a low-precision caller
};

}  // namespace lrnn
