// CPU backend: the pointwise passes of the driver as vectorized loops over the H
// columns of a row, parallelized over batch rows with at::parallel_for (on the calling
// thread in a build without OpenMP: kernels/extension/build.py); GEMMs are ATen's (MKL /
// oneDNN), and per-step GEMMs of up to 64 rows the panel kernel of rnn_panels.h.
// Exposed to Python as lstm_forward/backward, gru_forward/backward.
#include <torch/extension.h>

#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#define LRNN_HAS_MXCSR 1
#elif defined(__aarch64__)
#define LRNN_HAS_FPCR 1
#endif

#include "rnn_autograd.h"
#include "rnn_driver.h"
#include "rnn_driver_options.h"
#include "rnn_generate.h"
#include "rnn_random.h"

namespace lrnn {

// Denormal floats flushed to zero (FTZ) and read as zero (DAZ) in this thread while in
// scope, the caller's mode restored after. Gradients carried back over hundreds of steps
// decay into denormals, which many x86 CPUs handle an order of magnitude more slowly (a
// microcode assist per operation), so a long backward can spend most of its time on them.
// They lie below 1.2e-38 (float32) and 2.2e-308 (float64): flushing them changes no
// result beyond those magnitudes. On Arm (AArch64)
// the FPCR's FZ bit flushes inputs and results alike.
class FlushDenormals {
 public:
#if defined(LRNN_HAS_MXCSR)
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | kFtzDaz); }
  ~FlushDenormals() { _mm_setcsr(saved_); }

 private:
  static constexpr unsigned int kFtzDaz = 0x8040;  // MXCSR bits 15 (FTZ) and 6 (DAZ)
  unsigned int saved_;
#elif defined(LRNN_HAS_FPCR)
  FlushDenormals() : saved_(get()) { set(saved_ | kFz); }
  ~FlushDenormals() { set(saved_); }

 private:
  static constexpr uint64_t kFz = uint64_t(1) << 24;  // FPCR bit 24 (FZ)
  static uint64_t get() {
    uint64_t v;
    asm volatile("mrs %0, fpcr" : "=r"(v));
    return v;
  }
  static void set(uint64_t v) { asm volatile("msr fpcr, %0" : : "r"(v)); }
  uint64_t saved_;
#endif
};

// Entry point F run with denormals flushed in the calling thread (the worker threads of
// the pointwise passes flush their own: CpuDev), and with its ATen calls dispatched below
// autograd: the kernels' own tensors need no autograd bookkeeping (the Python
// autograd.Functions record the layer), and each of the few hundred narrow / mm / empty
// calls of a call then skips the Autograd and ADInplaceOrView layers (no view metadata
// per narrow), a fixed cost per call that shows at small hidden sizes. Skipping
// ADInplaceOrView as well as Autograd is what drops the view bookkeeping. Its tensors are
// ordinary ones (not inference tensors): outputs are saved for backward and returned as
// gradients. Views made in here get version counters of their own, so the weight-pack
// store takes a weight's version from the tensor the kernel was given (WeightPacks::get).
template <auto F>
struct Flushed;

template <class R, class... Args, R (*F)(Args...)>
struct Flushed<F> {
  static R call(Args... args) {
    FlushDenormals flushed;
    at::AutoDispatchBelowADInplaceOrView below_autograd;  // see the comment above
    return F(std::forward<Args>(args)...);
  }
};

// What the autograd node's calls run under (rnn_autograd.h), as Flushed's.
struct CpuScope {
  explicit CpuScope(const at::Tensor&) {}
  FlushDenormals flushed;
};

// For the per-element lambdas handed to CpuDev::for_rows: without it GCC may not inline
// the LSTM forward (five exp_approx per element) into the row loop, which then runs
// unvectorized.
#define RNN_HD_LAMBDA __attribute__((always_inline))

// Rows per parallel chunk: enough elements (4K, tens of thousands of cycles of pointwise
// work) that handing a chunk to another thread pays for the hand-off, and few enough that
// a step of batch 16-50 at hidden 64-128 (4H elements per row) splits into several chunks
// and so uses more than one thread. On one thread the grain changes nothing.
inline int64_t grain_rows(int64_t row_elems) {
  return std::max<int64_t>(1, (int64_t(1) << 12) / std::max<int64_t>(1, row_elems));
}

// A row's columns for the cell options' passes (rnn_options.h): vectorized loops.
struct CpuRowLoop {
  template <class F>
  void each(int64_t n, F&& f) const {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) f(j);
  }
  template <typename A, class F>
  A sum(int64_t n, F&& f) const {
    A total = A(0);
#pragma omp simd reduction(+ : total)
    for (int64_t j = 0; j < n; ++j) total += f(j);
    return total;
  }
  template <typename A, class F, class G>
  void sum2(int64_t n, F&& f, G&& g, A& total_f, A& total_g) const {
    A a = A(0), b = A(0);
#pragma omp simd reduction(+ : a, b)
    for (int64_t j = 0; j < n; ++j) {
      a += f(j);
      b += g(j);
    }
    total_f = a;
    total_g = b;
  }
};

struct CpuDev {
  static constexpr c10::DeviceType kDevice = c10::DeviceType::CPU;
  // The per-step h W_hh^T goes to a small buffer that stays in cache, and the pointwise
  // pass adds it to pre: addmm_ into pre's rows would read and write rows that are cold in
  // cache (and the buffer is what oneDNN writes anyway).
  static constexpr bool kStepIntoPre = false;

  template <class Cell, typename S, typename A>
  static void forward_step(const FwdStep<S, A>& s) {  // kStepIntoPre is false: s.hw is always set
    for_rows(s, [](const FwdRow<S, A>& r, int64_t H, int64_t j)
                    RNN_HD_LAMBDA { Cell::template forward<true>(r, H, j); });
  }

  template <class Cell, typename S, typename A>
  static void scan(const ScanArgs<S, A>& a, int64_t B) {
    const int64_t H = a.H;
    at::parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
      FlushDenormals flushed;
      for (int64_t b = b0; b < b1; ++b) {
        scan_tokens<Cell>(a, b, [&](const ScanRow<S, A>& r, const A* h0, S* h_prev_c, bool first) {
          if (first) {
            for (int64_t j = 0; j < H; ++j) h_prev_c[j] = S(h0[j]);
          }
#pragma omp simd
          for (int64_t j = 0; j < H; ++j) Cell::scan(r, H, j);
        });
      }
    });
  }

  template <class Cell, typename S, typename A>
  static void backward_step(const BwdStep<S, A>& s) {
    if (s.dh_in) {
      for_rows(s, [](const BwdRow<S, A>& r, int64_t H, int64_t j)
                      RNN_HD_LAMBDA { Cell::template backward<true>(r, H, j); });
    } else {
      for_rows(s, [](const BwdRow<S, A>& r, int64_t H, int64_t j)
                      RNN_HD_LAMBDA { Cell::template backward<false>(r, H, j); });
    }
  }

  // The cell options' row passes (rnn_options.h): rows in parallel, each row's columns in
  // vectorized loops (CpuRowLoop).
  template <class Opts, typename S, typename A>
  static void options_forward(const OptFwdStep<S, A>& s) {
    rows(s.n, 4 * s.H, [&](int64_t b) { Opts::forward(CpuRowLoop{}, s.row(b), s.H, s.P, s.p_c, s.p_h, s.project); });
  }

  template <typename S, typename A>
  static void options_finish(A* h, S* out, S* h_c, A* scratch, const A* rscale, const uint8_t* keep_h, int64_t n,
                             int64_t P, A p_h) {
    rows(n, P, [&](int64_t b) {
      finish_projected(CpuRowLoop{}, h + b * P, out + b * P, h_c + b * P, scratch + b * P,
                       rscale ? rscale + b * P : nullptr, keep_h ? keep_h + b * P : nullptr, P, p_h);
    });
  }

  template <bool kLstm, typename S, typename A>
  static void options_scan(const OptScanArgs<S, A>& a, int64_t B) {
    at::parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
      FlushDenormals flushed;
      for (int64_t b = b0; b < b1; ++b) lrnn::options_scan<kLstm>(CpuRowLoop{}, a, b);
    });
  }

  template <typename S, typename A>
  static void options_projected_scan(const OptScanArgs<S, A>& a, const S* htil, int64_t B) {
    at::parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
      FlushDenormals flushed;
      for (int64_t b = b0; b < b1; ++b) projected_scan(CpuRowLoop{}, a, htil, b);
    });
  }

  template <class Opts, typename S, typename A>
  static void options_backward(const OptBwdStep<S, A>& s) {
    rows(s.n, 4 * s.H, [&](int64_t b) { Opts::backward(CpuRowLoop{}, s.row(b), s.H, s.P, s.p_c, s.p_h, s.project); });
  }

  // The input side's layer norm over all tokens' rows (the temporal adapter's one call):
  // v (N, F) in place; its backward into da (N, F) from dy (rows of stride ldy), with a
  // (N, F) overwritten with a_hat.
  template <typename S, typename A>
  static void norm_rows(at::Tensor& v, const at::Tensor& w, const at::Tensor& b) {
    const int64_t F = v.size(1);
    A* p = ptr<A>(v);
    rows(v.size(0), F, [&](int64_t r) { norm_row(CpuRowLoop{}, p + r * F, ptr<A>(w), ptr<A>(b), F); });
  }

  // (da in the compute dtype, the gain's gradient: the column sums of dy * a_hat, summed in
  // float64 per chunk of rows)
  template <typename S, typename A>
  static std::pair<at::Tensor, at::Tensor> norm_rows_backward(const at::Tensor& dy, at::Tensor& a,
                                                              const at::Tensor& w) {
    const int64_t N = a.size(0), F = a.size(1), ldy = dy.stride(0);
    at::Tensor da = BufferPool::empty({N, F}, a.options().dtype(c10::CppTypeToScalarType<S>::value));
    at::Tensor dw = at::zeros({F}, a.options().dtype(at::kDouble));
    const A* d = ptr<A>(dy);
    A* x = ptr<A>(a);
    S* o = ptr<S>(da);
    double* total = ptr<double>(dw);
    std::mutex adding;
    at::parallel_for(0, N, grain_rows(F), [&](int64_t r0, int64_t r1) {
      FlushDenormals flushed;
      std::vector<double> part(F, 0.0);
      double* acc = part.data();
      for (int64_t r = r0; r < r1; ++r) {
        const A* dr = d + r * ldy;
        const A* xr = x + r * F;
        norm_row_backward(CpuRowLoop{}, dr, x + r * F, ptr<A>(w), o + r * F, F);  // x's row: now a_hat
#pragma omp simd
        for (int64_t k = 0; k < F; ++k) acc[k] += double(dr[k] * xr[k]);
      }
      const std::lock_guard<std::mutex> lock(adding);
      for (int64_t k = 0; k < F; ++k) total[k] += acc[k];
    });
    return {da, dw.to(a.scalar_type())};
  }

  // row(b) for the rows [0, n) in parallel (chunks of grain_rows(row_elems) rows).
  template <class Row>
  static void rows(int64_t n, int64_t row_elems, Row row) {
    at::parallel_for(0, n, grain_rows(row_elems), [&](int64_t b0, int64_t b1) {
      FlushDenormals flushed;
      for (int64_t b = b0; b < b1; ++b) row(b);
    });
  }

  // elem(row, H, j) for the rows [0, s.n) of a step (in parallel) and its H columns (vectorized).
  template <class Step, class Elem>
  static void for_rows(const Step& s, Elem elem) {
    const int64_t H = s.H;
    at::parallel_for(0, s.n, grain_rows(4 * H), [&](int64_t b0, int64_t b1) {
      FlushDenormals flushed;
      for (int64_t b = b0; b < b1; ++b) {
        const auto r = s.row(b);
#pragma omp simd
        for (int64_t j = 0; j < H; ++j) elem(r, H, j);
      }
    });
  }
};

}  // namespace lrnn

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace lrnn;
  m.doc() = "lightning_rnn fused LSTM/GRU kernels (CPU)";
  // The kernels run without the GIL, as torch's own ops do: other Python threads (an
  // inference server's, a logger's) run meanwhile, and kernel calls from several threads
  // run at once. They touch no Python object; the pool and the pack store lock what they share.
  const auto nogil = py::call_guard<py::gil_scoped_release>();
  m.def("lstm_forward", &Flushed<&rnn_forward<LstmCell, CpuDev>>::call, "LSTM forward of one layer-direction", nogil);
  m.def("lstm_backward", &Flushed<&rnn_backward<LstmCell, CpuDev>>::call, "LSTM backward of one layer-direction", nogil);
  m.def("gru_forward", &Flushed<&rnn_forward<GruCell, CpuDev>>::call, "GRU forward of one layer-direction", nogil);
  m.def("gru_backward", &Flushed<&rnn_backward<GruCell, CpuDev>>::call, "GRU backward of one layer-direction", nogil);
  def_autograd_entry_points<CpuDev, CpuScope>(m);  // lstm/gru _apply, _stack, _padded
  m.def("random_mask", &random_mask, "a bool tensor of numel elements, each true with probability p, from a seed",
        nogil);
  m.def("lstm_options_forward", &Flushed<&options_forward_entry<LstmCell, CpuDev>>::call,
        "LSTM forward of one layer-direction with cell options", nogil);
  m.def("lstm_options_backward", &Flushed<&options_backward_entry<LstmCell, CpuDev>>::call,
        "LSTM backward of one layer-direction with cell options", nogil);
  m.def("gru_options_forward", &Flushed<&options_forward_entry<GruCell, CpuDev>>::call,
        "GRU forward of one layer-direction with cell options", nogil);
  m.def("gru_options_backward", &Flushed<&options_backward_entry<GruCell, CpuDev>>::call,
        "GRU backward of one layer-direction with cell options", nogil);
  // the bound's ATen calls dispatched as the layers' are (Flushed)
  m.def("lstm_gemm_bound", &Flushed<&gemm_bound<LstmCell>>::call, "the GEMMs of an LSTM fwd+bwd alone (benchmarks)",
        nogil);
  m.def("gru_gemm_bound", &Flushed<&gemm_bound<GruCell>>::call, "the GEMMs of a GRU fwd+bwd alone (benchmarks)", nogil);
  m.def("num_threads", &at::get_num_threads, "intra-op threads seen by the extension");
  m.def("transposed", &transposed, "a^T as a new contiguous tensor (the weight gradients' blocked transpose)");
  m.def("panels_enabled", &PanelGemm::enabled, "whether the kernels run their step GEMMs on panels");
  m.def("set_panels", &PanelGemm::set_enabled, "use panels (True) or MKL/oneDNN (False) from now on (tests)");
  m.def("grad_chunk_rows", &GradChunking::rows,
        "rows per chunk of the backward's dx/dW GEMMs (cpu_one_precision, N, row_bytes; 0: after the loop)");
  m.def("force_grad_chunk_rows", &GradChunking::force,
        "chunks of this many rows wherever allowed (tests); 0: after the loop, -1: automatic");
  m.def("forced_grad_chunk_rows", &GradChunking::forced_rows, "the forced chunk rows (-1: automatic)");
  m.def("set_pool_capacity", &BufferPool::set_capacity,
        "keep at most this many bytes of big kernel buffers mapped between calls (0: none)");
  m.def("pool_capacity", &BufferPool::get_capacity, "bytes of kernel buffers kept mapped at most");
  m.def("pool_idle_bytes", &BufferPool::idle_bytes, "bytes of kernel buffers kept mapped now, unused");
  m.def("mkl_generic", &MklPath::generic,
        "whether the kernels choose their GEMMs for MKL's generic kernels (an AVX-512 CPU not made by Intel)");
  m.def("mkl_generic_detected", &MklPath::detected_generic, "what mkl_generic() detects, whatever is forced");
  m.def("force_mkl_generic", &MklPath::force,
        "tests: choose GEMMs as if MKL ran its generic kernels (1) or not (0); -1 detects again");
  m.def("widens", [](const at::Tensor& t) { return Widen::applies(t); },
        "whether GEMMs with operands like t run in float32 (bf16 / fp16 on a CPU without a fast GEMM for them)");
  m.def("force_widen", &Widen::force,
        "tests: run every bf16 / fp16 CPU GEMM in float32 (1), none (0); -1 detects again");
  m.def("panel_width", [] { return PanelGemm::kWidth; }, "columns per panel: two of the build's widest vectors");
  m.def("panels", &PanelGemm::pack, "a float32 (K, N) matrix copied into the step GEMM's (ceil(N/w), K, w) panels, w = panel_width()");
  m.def(
      "panel_gemm",
      [](const at::Tensor& a, const at::Tensor& panels, int64_t N) {
        TORCH_CHECK(a.dim() == 2 && PanelGemm::supports(a) && a.stride(1) == 1,
                    "panel_gemm: expected a float32 CPU matrix a (n, K) with unit column stride, got ", a.sizes(),
                    " ", a.scalar_type());
        TORCH_CHECK(panels.dim() == 3 && PanelGemm::supports(panels) && panels.is_contiguous() &&
                        panels.size(1) == a.size(1) && panels.size(2) == PanelGemm::kWidth &&
                        panels.size(0) == (N + PanelGemm::kWidth - 1) / PanelGemm::kWidth,
                    "panel_gemm: expected panels(m) of a float32 (", a.size(1), ", ", N, ") matrix m, got ",
                    panels.sizes(), " ", panels.scalar_type());
        at::Tensor y = at::empty({a.size(0), N}, a.options());
        PanelGemm::run(a, panels, N, y);
        return y;
      },
      "a @ m for panels = panels(m) of m (K, N): the per-step GEMM");
  m.def(
      "panel_tiles",
      [](int64_t n) {
        TORCH_CHECK(n >= 0, "panel_tiles: expected rows >= 0, got ", n);
        std::vector<int64_t> tiles;
        for (int64_t left = n; left > 0; left -= tiles.back()) tiles.push_back(PanelGemm::tile_rows_at(left));
        return tiles;
      },
      "the register tiles (rows each) the panel GEMM splits n rows into");
  py::class_<WeightPacks>(m, "WeightPacks", "packed weights reused by kernel calls while active (`with store:`)")
      .def(py::init<>())
      .def("__enter__", [](WeightPacks& p) -> WeightPacks& { p.enter(); return p; }, py::return_value_policy::reference)
      .def("__exit__", [](WeightPacks& p, py::args) { p.exit(); })
      .def("clear", &WeightPacks::clear, "drop the packed copies")
      .def("__len__", &WeightPacks::size, "number of packed weights held");
  // token-by-token generation (rnn_generate.h; kernels/generate.py)
  m.def("lstm_generate", &Flushed<&generate<LstmCell>>::call, "steps of an LSTM language model's sampling", nogil);
  m.def("gru_generate", &Flushed<&generate<GruCell>>::call, "steps of a GRU language model's sampling", nogil);
  m.def("draw_tokens", &Flushed<&draw_tokens>::call, "one token per row of logits, as generation draws it", nogil);
  m.def("generation_panels", &pack_panels, "a matrix in the column panels generation reads", nogil);
}
