// The device-independent driver of one direction of one LSTM/GRU layer.
//
// Forward:  pre = x W_ih^T (one GEMM, all N tokens); per step: hw = h_{t-1} W_hh^T
//           (one GEMM into a preallocated buffer) + one fused pointwise pass (Dev).
// Backward: one pointwise scan rebuilds c_t (LSTM) / h_{t-1} (GRU, also for dW_hh);
//           per step (reverse order): one fused pointwise pass writing dG, accumulating
//           the bias gradient per row and (LSTM) writing h_t for dW_hh, then dh_{t-1} =
//           dG_h W_hh (one GEMM);
//           dx, dW_ih, dW_hh as GEMMs over chunks of rows the loop has finished (one CPU
//           thread, rnn_grad_gemms.h) or over all N rows after the loop.
//
// LSTM with a projection (w_hr (P, H), torch.nn's proj_size): per step the pointwise pass
// writes r = o * tanh(c) to a (B, H) buffer and one more GEMM gives h_t = r W_hr^T (n, P),
// the step's output rows and the next step's GEMM input. Backward, per step: dh_t (n, P)
// = d_out + carry is kept (for dW_hr), dr = dh_t W_hr (one GEMM) feeds the pointwise pass,
// and the carry is dG_h W_hh (n, P); the pass writes r_t per token, and one GEMM over all
// rows rebuilds h_t for dW_hh.
//
// Templated on the cell (LstmCell / GruCell, rnn_cells.h) and the device (Dev provides
// forward_step, scan, backward_step for FwdStep/ScanArgs/BwdStep). Shapes as in
// kernels/reference.py: x (N, I), h0 (B, P), c0 (B, H), w_ih (G*H, I), w_hh (G*H, P),
// w_hr (P, H); P = H without a projection.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Optional.h>

#include <algorithm>
#include <optional>
#include <tuple>
#include <vector>

#include "rnn_cells.h"
#include "rnn_gemm.h"
#include "rnn_grad_gemms.h"
#include "rnn_schedule.h"

namespace lrnn {

using OptTensor = c10::optional<at::Tensor>;

// ---- host-side layout of each cell ----------------------------------------------------
template <class Cell>
struct Layout;

template <>
struct Layout<LstmCell> {
  static std::vector<GradBlock> input_blocks(int64_t H) { return {{0, 4 * H, 0}}; }
  // (bias (4H), b_hn (placeholder)) in the state dtype.
  static std::pair<at::Tensor, at::Tensor> fold_bias(const OptTensor& b_ih, const OptTensor& b_hh, int64_t H,
                                                     const at::TensorOptions& opt) {
    at::Tensor bias = b_ih ? (*b_ih + *b_hh).to(opt.dtype()).contiguous() : at::zeros({4 * H}, opt);
    return {bias, at::zeros({H}, opt)};
  }
  static at::Tensor gates_buffer(const at::Tensor& pre) { return pre; }  // in place
  static std::pair<at::Tensor, at::Tensor> bias_grads(const at::Tensor& db, int64_t H) { return {db, db}; }
};

template <>
struct Layout<GruCell> {
  // internal dG layout [dr, dz, dhn, dn]; W_ih rows [r, z, n]
  static std::vector<GradBlock> input_blocks(int64_t H) { return {{0, 2 * H, 0}, {3 * H, H, 2 * H}}; }
  static std::pair<at::Tensor, at::Tensor> fold_bias(const OptTensor& b_ih, const OptTensor& b_hh, int64_t H,
                                                     const at::TensorOptions& opt) {
    if (!b_ih) return {at::zeros({3 * H}, opt), at::zeros({H}, opt)};
    at::Tensor bias = b_ih->to(opt.dtype()).clone();
    bias.narrow(0, 0, 2 * H).add_(b_hh->narrow(0, 0, 2 * H));
    return {bias, b_hh->narrow(0, 2 * H, H).to(opt.dtype()).contiguous()};
  }
  static at::Tensor gates_buffer(const at::Tensor& pre) {
    return BufferPool::empty({pre.size(0), pre.size(1) / 3 * 4}, pre.options());
  }
  static std::pair<at::Tensor, at::Tensor> bias_grads(const at::Tensor& db, int64_t H) {
    return {at::cat({db.narrow(0, 0, 2 * H), db.narrow(0, 3 * H, H)}), db.narrow(0, 0, 3 * H)};
  }
};

// ---- boundary checks ----------------------------------------------------------------
inline void check_float(const at::Tensor& t, const char* name, const at::Device& device) {
  TORCH_CHECK(t.defined(), name, ": expected a tensor, got None");
  TORCH_CHECK(at::isFloatingType(t.scalar_type()), name, ": expected a floating-point tensor, got ",
              t.scalar_type());
  TORCH_CHECK(t.device() == device, name, ": expected a tensor on ", device, " (like x), got ", t.device());
}

inline void check_shape(const at::Tensor& t, const char* name, at::IntArrayRef shape) {
  TORCH_CHECK(t.sizes() == shape, name, ": expected shape ", shape, ", got ", t.sizes());
}

struct Sizes {
  int64_t N, I, H, B, P;  // P: h's columns (the projection's size; H without one)
};

template <class Cell>
Sizes check_inputs(const at::Tensor& x, const Schedule& s, const at::Tensor& h0, const OptTensor& c0,
                   const at::Tensor& w_ih, const at::Tensor& w_hh, const OptTensor& b_ih,
                   const OptTensor& b_hh, const OptTensor& w_hr) {
  const auto dev = x.device();
  check_float(x, "x", dev);
  TORCH_CHECK(x.dim() == 2, "x: expected a 2-D (N, input_size) tensor, got shape ", x.sizes());
  TORCH_CHECK(x.size(0) == s.N, "x: expected ", s.N, " rows (sum of batch_sizes), got ", x.size(0));
  check_float(w_hh, "w_hh", dev);
  TORCH_CHECK(w_hh.dim() == 2, "w_hh: expected a 2-D tensor, got shape ", w_hh.sizes());
  const int64_t P = w_hh.size(1);
  int64_t H = P;
  if (w_hr) {
    TORCH_CHECK(Cell::kProjGates == 4, "w_hr: a projection is supported for LSTM only");
    check_float(*w_hr, "w_hr", dev);
    TORCH_CHECK(w_hr->dim() == 2 && w_hr->size(0) == P, "w_hr: expected a 2-D (", P,
                ", hidden_size) tensor (w_hh has ", P, " columns), got shape ", w_hr->sizes());
    TORCH_CHECK(w_hr->scalar_type() == w_hh.scalar_type(), "w_hr: expected dtype ", w_hh.scalar_type(),
                " (like w_hh), got ", w_hr->scalar_type());
    H = w_hr->size(1);
  }
  const int64_t GH = Cell::kProjGates * H, I = x.size(1);
  check_shape(w_hh, "w_hh", {GH, P});
  check_float(w_ih, "w_ih", dev);
  check_shape(w_ih, "w_ih", {GH, I});
  TORCH_CHECK(w_ih.scalar_type() == w_hh.scalar_type(), "w_hh: expected dtype ", w_ih.scalar_type(),
              " (like w_ih), got ", w_hh.scalar_type());
  check_float(h0, "h0", dev);
  check_shape(h0, "h0", {s.B, P});
  if (c0) {
    check_float(*c0, "c0", dev);
    check_shape(*c0, "c0", {s.B, H});
  }
  TORCH_CHECK(b_ih.has_value() == b_hh.has_value(), "b_ih, b_hh: expected both or neither");
  if (b_ih) {
    check_float(*b_ih, "b_ih", dev);
    check_shape(*b_ih, "b_ih", {GH});
    check_float(*b_hh, "b_hh", dev);
    check_shape(*b_hh, "b_hh", {GH});
  }
  return {s.N, I, H, s.B, P};
}

// Calls f.template operator()<S, A>() for the supported (compute, state) pairs.
template <class F>
void dispatch_precision(at::ScalarType compute, at::ScalarType state, F&& f) {
  using at::kBFloat16, at::kDouble, at::kFloat, at::kHalf;
  if (compute == kFloat && state == kFloat) return f.template operator()<float, float>();
  if (compute == kDouble && state == kDouble) return f.template operator()<double, double>();
  if (compute == kBFloat16 && state == kFloat) return f.template operator()<c10::BFloat16, float>();
  if (compute == kHalf && state == kFloat) return f.template operator()<c10::Half, float>();
  TORCH_CHECK(false, "compute/state dtype: unsupported pair (", compute, ", ", state,
              "); supported: (float, float), (double, double), (bfloat16, float), (half, float)");
}

template <typename T>
T* ptr(const at::Tensor& t) { return reinterpret_cast<T*>(t.data_ptr()); }

// ---- forward --------------------------------------------------------------------------
// Returns {out (N,P), h_n (B,P), c_n (B,H) LSTM / undefined, gates (N,4H), x_c (N,I)};
// h_n in the compute dtype for the LSTM, the state dtype for the GRU.
template <class Cell, class Dev>
std::vector<at::Tensor> rnn_forward(const at::Tensor& x, const at::Tensor& batch_sizes, const at::Tensor& h0,
                                    const OptTensor& c0, const at::Tensor& w_ih, const at::Tensor& w_hh,
                                    const OptTensor& b_ih, const OptTensor& b_hh, const OptTensor& w_hr,
                                    bool reverse, at::ScalarType compute, at::ScalarType state) {
  TORCH_CHECK(x.device().type() == Dev::kDevice, "x: expected a tensor on ", Dev::kDevice, ", got ", x.device());
  const Schedule s(batch_sizes, reverse);
  const Sizes z = check_inputs<Cell>(x, s, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr);
  const int64_t H = z.H, G = Cell::kProjGates;
  const auto copt = x.options().dtype(compute), sopt = x.options().dtype(state);
  const bool proj = w_hr.has_value();

  at::Tensor x_c = x.to(compute).contiguous();
  const at::Tensor w_hh_c = w_hh.to(compute);                        // (G*H, P)
  at::Tensor pre = proj_gemm_pooled(x_c, w_ih.to(compute));         // (N, G*H)
  at::Tensor gates = Layout<Cell>::gates_buffer(pre);                // (N, 4H)
  at::Tensor bias, b_hn;  // (G*H), (H): not a structured binding, which clang < 16 cannot capture
  std::tie(bias, b_hn) = Layout<Cell>::fold_bias(b_ih, b_hh, H, sopt);
  at::Tensor out = at::empty({z.N, z.P}, copt);
  at::Tensor h_c = h0.to(compute).clone().contiguous();              // (B, P) GEMM input
  // (B, H) GRU state (unused by the LSTM); with a projection, r = o * tanh(c) of a step
  at::Tensor h = proj ? at::empty({z.B, H}, sopt) : h0.to(state).clone().contiguous();
  at::Tensor r = proj ? at::empty({z.B, H}, copt) : at::Tensor();
  at::Tensor c = c0 ? c0->to(state).clone().contiguous() : at::empty({z.B, H}, sopt);
  // The per-step h W_hh^T (rnn_gemm.h: panels, oneDNN or ATen) writes a small hot buffer
  // hw that the pointwise pass adds to pre (faster than addmm_ into the cache-cold rows of
  // pre on CPU). LSTM in one precision on a device that prefers it (Dev::kStepIntoPre)
  // with an ATen GEMM: h W_hh^T is accumulated into pre in place instead.
  const StepGemm step_gemm = StepGemm::forward(w_hh_c, z.B, s.T);
  const std::optional<StepGemm> project =
      proj ? std::optional<StepGemm>(StepGemm::forward(w_hr->to(compute), z.B, s.T)) : std::nullopt;
  const bool hw_in_pre =
      Dev::kStepIntoPre && Cell::kHwInPre && compute == state && step_gemm.kind() == StepGemm::Kind::kAten;
  at::Tensor hw = at::empty({hw_in_pre ? 0 : z.B, G * H}, copt);
  dispatch_precision(compute, state, [&]<typename S, typename A>() {
    for (int64_t k = 0; k < s.T; ++k) {
      const int64_t t = s.step(k), n = s.sizes[t], off = s.offsets[t];
      at::Tensor hw_step;  // holds oneDNN's fresh result while the pointwise pass reads it
      if (hw_in_pre) {
        pre.narrow(0, off, n).addmm_(h_c.narrow(0, 0, n), step_gemm.plain());
      } else if (step_gemm.run_rows(ptr<S>(h_c), z.P, n, ptr<S>(hw), G * H)) {
        hw_step = hw;
      } else {
        hw_step = step_gemm.run(h_c.narrow(0, 0, n), hw.narrow(0, 0, n));
      }
      const S* hw_ptr = hw_step.defined() ? ptr<S>(hw_step) : nullptr;
      S* h_next = proj ? ptr<S>(r) : ptr<S>(h_c);             // the cell's h (r when projected)
      S* out_rows = proj ? ptr<S>(r) : ptr<S>(out) + off * H;
      FwdStep<S, A> step{ptr<S>(pre) + off * G * H, hw_ptr, ptr<A>(bias),
                         ptr<A>(b_hn), ptr<S>(gates) + off * 4 * H, ptr<A>(h), ptr<A>(c), h_next,
                         out_rows, n, H, G};
      Dev::template forward_step<Cell, S, A>(step);
      if (proj) {  // h_t = r W_hr^T: the step's output rows and the next step's GEMM input
        at::Tensor rows = out.narrow(0, off, n);
        const at::Tensor y = project->run(r.narrow(0, 0, n), rows);
        if (y.data_ptr() != rows.data_ptr()) rows.copy_(y);
        h_c.narrow(0, 0, n).copy_(rows);
      }
    }
  });
  // h_n: the LSTM's h (its next use is a GEMM operand, so the compute dtype loses nothing);
  // the GRU's h in the state dtype, as its next step would read it (a chunk boundary of
  // gradient checkpointing, or state carried across batches, must not round it).
  return {out, c0 ? h_c : h, c0 ? c : at::Tensor(), gates, x_c};
}

// h_{t-1} (N, P) of every token of a projected LSTM: h_t = r_t W_hr^T for all rows in one
// GEMM, then each step's rows take the previous step's (rows that step had) or h0.
inline at::Tensor projected_prev(const at::Tensor& r, const at::Tensor& w_hr, const at::Tensor& h0,
                                 const Schedule& s) {
  const at::Tensor h = proj_gemm(r, w_hr);  // (N, P)
  at::Tensor h_prev = at::empty_like(h);
  for (int64_t t = 0; t < s.T; ++t) {
    const int64_t n = s.sizes[t], off = s.offsets[t], p = s.prev(t);
    const int64_t m = p < 0 ? 0 : std::min(n, s.sizes[p]);
    if (m) h_prev.narrow(0, off, m).copy_(h.narrow(0, s.offsets[p], m));
    if (m < n) h_prev.narrow(0, off + m, n - m).copy_(h0.narrow(0, m, n - m));
  }
  return h_prev;
}

// ---- backward -------------------------------------------------------------------------
// needs = (x, h0, c0, w_ih, w_hh, bias, w_hr). Returns {dx, dh0, dc0, dw_ih, dw_hh, db_ih,
// db_hh, dw_hr}; tensors that are not needed are undefined.
// dw_ih_into / dw_hh_into (optional, shaped as w_ih / w_hh, in the compute dtype): running
// sums the weight gradients are added into in place (one GEMM with beta = 1, no fresh
// result, no separate pass to add it) and returned as dw_ih / dw_hh. Gradient
// checkpointing sums its chunks' weight gradients this way (kernels/checkpointing.py).
template <class Cell, class Dev>
std::vector<at::Tensor> rnn_backward(const at::Tensor& x_c, const at::Tensor& gates, const at::Tensor& h0,
                                     const OptTensor& c0, const at::Tensor& w_ih, const at::Tensor& w_hh,
                                     const OptTensor& w_hr, const at::Tensor& d_out, const at::Tensor& d_hn,
                                     const OptTensor& d_cn, const at::Tensor& batch_sizes, bool reverse,
                                     std::vector<bool> needs, at::ScalarType state,
                                     c10::optional<at::ScalarType> bias_dtype, const OptTensor& dw_ih_into,
                                     const OptTensor& dw_hh_into) {
  TORCH_CHECK(x_c.device().type() == Dev::kDevice, "x_c: expected a tensor on ", Dev::kDevice, ", got ",
              x_c.device());
  const Schedule s(batch_sizes, reverse);
  const Sizes z = check_inputs<Cell>(x_c, s, h0, c0, w_ih, w_hh, c10::nullopt, c10::nullopt, w_hr);
  const int64_t H = z.H, P = z.P, B = z.B, N = z.N, HG = Cell::kHiddenGrad * H;
  const at::ScalarType compute = x_c.scalar_type();
  const auto copt = x_c.options().dtype(compute), sopt = x_c.options().dtype(state);
  const bool proj = w_hr.has_value();
  TORCH_CHECK(needs.size() == 7, "needs: expected 7 flags (x, h0, c0, w_ih, w_hh, bias, w_hr)");
  TORCH_CHECK(gates.scalar_type() == compute && gates.sizes() == at::IntArrayRef({N, 4 * H}),
              "gates: expected (", N, ", ", 4 * H, ") of dtype ", compute, ", got ", gates.sizes(), " ",
              gates.scalar_type());
  check_float(d_out, "d_out", x_c.device());
  check_shape(d_out, "d_out", {N, P});
  check_float(d_hn, "d_hn", x_c.device());
  check_shape(d_hn, "d_hn", {B, P});
  TORCH_CHECK(c0.has_value() == d_cn.has_value(), "d_cn: expected exactly when c0 is given");
  if (d_cn) check_shape(*d_cn, "d_cn", {B, H});

  const auto sum_into = [&](const OptTensor& into, const at::Tensor& w, const char* name) {
    if (!into || !into->defined()) return false;
    TORCH_CHECK(into->scalar_type() == compute && w.scalar_type() == compute && into->sizes() == w.sizes() &&
                    into->is_contiguous() && into->device() == x_c.device(),
                name, ": expected a contiguous ", compute, " tensor of shape ", w.sizes(), " on ", x_c.device(),
                " (weights in the compute dtype)",
                ", got ", into->scalar_type(), " ", into->sizes());
    return true;
  };
  const bool sum_ih = needs[3] && sum_into(dw_ih_into, w_ih, "dw_ih_into");
  const bool sum_hh = needs[4] && sum_into(dw_hh_into, w_hh, "dw_hh_into");

  const at::Tensor gates_c = gates.contiguous();
  // d_out as the kernel reads it; a copy where needed (e.g. the expanded ones of
  // out.sum().backward()) into a pooled block
  const at::Tensor d_out_c = d_out.scalar_type() == compute && d_out.is_contiguous()
                                 ? d_out
                                 : BufferPool::empty(d_out.sizes(), copt).copy_(d_out);
  // (G*H, P) as given (row-major): the per-step dG_h W_hh is an "NN" GEMM. A transposed
  // copy (to run it as "NT") would cost a full strided pass over W_hh on every call, a
  // fixed cost that dominates short calls (checkpointed chunks), for no GEMM speed.
  const at::Tensor w_hh_c = w_hh.to(compute).contiguous();
  const at::Tensor w_hr_c = proj ? w_hr->to(compute).contiguous() : at::Tensor();  // (P, H)
  const at::Tensor h0_s = h0.to(state).contiguous();
  const at::Tensor c0_s = c0 ? c0->to(state).contiguous() : at::zeros({B, H}, sopt);
  // scratch of this call: BufferPool blocks, kept mapped between calls (rnn_pool.h)
  at::Tensor states = BufferPool::empty({N, H}, sopt);    // LSTM c_t / GRU h_{t-1}
  at::Tensor h_prev_c = BufferPool::empty({N, H}, copt);  // h_{t-1} for dW_hh (projected: r_t)
  at::Tensor tail = at::empty({B, H}, sopt), tail_c = at::empty({B, H}, copt);
  at::Tensor dG = BufferPool::empty({N, 4 * H}, copt);
  // The pointwise pass adds each step's gate gradients into db_rows (per batch row); every
  // kBiasBlock steps they move on into db_sum, so that no float32 running sum spans more
  // than kBiasBlock steps: the rounding error of one running sum grows with the number of
  // terms, and over thousands of steps it would fall well short of torch.nn's accuracy.
  constexpr int64_t kBiasBlock = 32;
  // db_sum is float64: thousands of blocks (T 10,000+) add up without a float32 running sum.
  at::Tensor db_rows = at::zeros({B, 4 * H}, sopt), db_sum = at::zeros({B, 4 * H}, sopt.dtype(at::kDouble));
  // The carried dh: (B, H) into the pointwise pass; with a projection the pass starts
  // from zeros and the (B, P) carry dh_p lives outside it, with dh_t of every token kept
  // in d_h (N, P) for dW_hr and dr = dh_t W_hr (B, H) as the pass's output gradient.
  at::Tensor dh = proj ? at::zeros({B, H}, sopt) : d_hn.to(state).clone().contiguous();
  at::Tensor dh_p = proj ? d_hn.to(state).clone().contiguous() : at::Tensor();
  at::Tensor d_h = proj ? at::empty({N, P}, copt) : at::Tensor();
  at::Tensor dr = proj ? at::empty({B, H}, copt) : at::Tensor();
  at::Tensor dc = d_cn ? d_cn->to(state).clone().contiguous() : at::zeros({B, H}, sopt);
  at::Tensor dh_in = at::zeros({B, P}, copt);         // per-step GEMM output
  at::Tensor zeros = at::zeros({H}, copt);
  const at::Tensor steps_dev = at::tensor(s.sizes).to(x_c.device());
  const at::Tensor offs_dev = at::tensor(s.offsets).to(x_c.device());

  // The per-step dG_h W_hh (rnn_gemm.h): with an ATen GEMM in one precision, dh_{t-1} =
  // carry + dG_h W_hh accumulates straight into dh (addmm_); otherwise the GEMM writes
  // dh_in, added in the next step's pointwise pass (projected: before dh_t W_hr).
  const StepGemm step_gemm = StepGemm::backward(w_hh_c, HG, B, s.T);
  const std::optional<StepGemm> unproject =
      proj ? std::optional<StepGemm>(StepGemm::backward(w_hr_c, P, B, s.T)) : std::nullopt;
  const bool dh_direct = !proj && compute == state && step_gemm.kind() == StepGemm::Kind::kAten;
  // dx, dW_ih, dW_hh: in chunks of rows inside the loop or once after it (rnn_grad_gemms.h)
  const bool chunkable = Dev::kDevice == c10::DeviceType::CPU && compute == state && !proj;
  const at::Tensor w_ih_c = needs[0] || needs[3] ? w_ih.to(compute) : at::Tensor();  // a cast only if read
  GradGemms grad_gemms(Layout<Cell>::input_blocks(H), dG, HG, x_c, w_ih_c, h_prev_c, needs[0],
                       needs[3], needs[4], sum_ih ? dw_ih_into : c10::nullopt, sum_hh ? dw_hh_into : c10::nullopt,
                       GradChunking::rows(chunkable, N, 4 * H * dG.element_size()));

  dispatch_precision(compute, state, [&]<typename S, typename A>() {
    ScanArgs<S, A> scan{ptr<S>(gates_c), ptr<A>(h0_s), ptr<A>(c0_s), ptr<A>(states), ptr<S>(h_prev_c),
                        ptr<A>(tail), ptr<S>(tail_c), ptr<int64_t>(steps_dev), ptr<int64_t>(offs_dev),
                        s.T, H, s.reverse, proj};
    Dev::template scan<Cell, S, A>(scan, B);
    int64_t m_in = 0;
    for (int64_t k = s.T - 1; k >= 0; --k) {
      const int64_t t = s.step(k), n = s.sizes[t], off = s.offsets[t], p = s.prev(t);
      // The LSTM's pass writes h_t = o * tanh(c_t) for dW_hh: into the rows of the step
      // after t (nt, which the loop did last) that continue t's sequences, or with a
      // projection into t's own rows (r_t); so nt's rows are done for the GEMMs only now.
      const int64_t nt = k + 1 < s.T ? s.step(k + 1) : -1;
      S* h_next = proj ? ptr<S>(h_prev_c) + off * H : nt < 0 ? nullptr : ptr<S>(h_prev_c) + s.offsets[nt] * H;
      const int64_t m_next = proj ? n : nt < 0 ? 0 : std::min(n, s.sizes[nt]);
      const S* d_rows = ptr<S>(d_out_c) + off * P;
      if (proj) {  // dh_t = d_out + carry (n, P), kept in d_h; the pass gets dr = dh_t W_hr
        at::Tensor carry = dh_p.narrow(0, 0, n), dh_t = d_h.narrow(0, off, n), dr_n = dr.narrow(0, 0, n);
        carry.add_(d_out_c.narrow(0, off, n));
        const int64_t m = std::min(m_in, n);
        if (m) dh_p.narrow(0, 0, m).add_(dh_in.narrow(0, 0, m));
        dh_t.copy_(carry);
        carry.zero_();
        const at::Tensor y = unproject->run(dh_t, dr_n);
        if (y.data_ptr() != dr_n.data_ptr()) dr_n.copy_(y);
        d_rows = ptr<S>(dr);
      }
      const A* prev = p < 0 ? nullptr : ptr<A>(states) + s.offsets[p] * H;
      BwdStep<S, A> step{ptr<S>(gates_c) + off * 4 * H, ptr<A>(states) + off * H, prev, ptr<A>(c0_s),
                         p < 0 ? 0 : s.sizes[p], d_rows, dh_direct || proj ? nullptr : ptr<S>(dh_in),
                         ptr<S>(zeros), m_in, ptr<A>(dh), ptr<A>(dc), ptr<S>(dG) + off * 4 * H, ptr<A>(db_rows),
                         h_next, m_next, ptr<S>(tail_c), n, H};
      Dev::template backward_step<Cell, S, A>(step);
      if (dh_direct) {
        dh.narrow(0, 0, n).addmm_(dG.narrow(0, off, n).narrow(1, 0, HG), step_gemm.plain());
      } else if (!step_gemm.run_rows(ptr<S>(dG) + off * 4 * H, 4 * H, n, ptr<S>(dh_in), P)) {
        at::Tensor dh_in_n = dh_in.narrow(0, 0, n);
        const at::Tensor y = step_gemm.run(dG.narrow(0, off, n).narrow(1, 0, HG), dh_in_n);
        if (y.data_ptr() != dh_in_n.data_ptr()) dh_in_n.copy_(y);  // oneDNN's fresh (n x P) result
      }
      m_in = n;
      if (nt >= 0) grad_gemms.rows_done(s.offsets[nt], s.sizes[nt]);
      if (needs[5] && (s.T - k) % kBiasBlock == 0) {
        db_sum.add_(db_rows);
        db_rows.zero_();
      }
    }
  });

  const int64_t last = s.step(0);  // its h_{t-1} rows are h0, written by the scan
  grad_gemms.rows_done(s.offsets[last], s.sizes[last]);
  std::vector<at::Tensor> grads(8);
  if (proj && needs[4]) grad_gemms.set_h_prev(projected_prev(h_prev_c, w_hr_c, h0.to(compute), s));
  grad_gemms.finish();
  if (needs[0]) grads[0] = grad_gemms.dx;
  if (needs[3]) grads[3] = grad_gemms.dw_ih.to(w_ih.scalar_type());
  const at::Tensor carry = proj ? dh_p : dh;
  if (needs[1]) grads[1] = (carry + dh_in).to(h0.scalar_type());
  if (needs[2] && c0) grads[2] = dc.to(c0->scalar_type());
  if (needs[4]) grads[4] = grad_gemms.dw_hh.to(w_hh.scalar_type());
  if (needs[5] && bias_dtype) {
    auto [db_ih, db_hh] = Layout<Cell>::bias_grads(db_sum.add_(db_rows).sum(0), H);
    grads[5] = db_ih.to(*bias_dtype);
    grads[6] = db_hh.to(*bias_dtype);
  }
  if (needs[6] && proj) grads[7] = wgrad_gemm(d_h, h_prev_c).to(w_hr->scalar_type());  // dh^T r
  return grads;
}

// ---- the GEMM-only lower bound --------------------------------------------------------
// Runs exactly the GEMMs of one forward + backward (same shapes, same buffers, same
// calls: oneDNN where the layer uses it, rnn_gemm.h) with no pointwise work: the time a
// fused layer cannot beat. Returns nothing.
template <class Cell>
void gemm_bound(const at::Tensor& x, const at::Tensor& batch_sizes, const at::Tensor& w_ih,
                const at::Tensor& w_hh) {
  const Schedule s(batch_sizes, false);
  const int64_t H = w_hh.size(1), G = Cell::kProjGates, HG = Cell::kHiddenGrad * H;
  const auto opt = x.options();
  at::Tensor pre = proj_gemm_pooled(x, w_ih);
  at::Tensor h = at::zeros({s.B, H}, opt), hw = at::empty({s.B, G * H}, opt);
  const StepGemm forward_step = StepGemm::forward(w_hh, s.B, s.T);
  const bool f32 = x.scalar_type() == at::kFloat;  // the layers' per-step calls (rnn_backward)
  for (int64_t t = 0; t < s.T; ++t) {
    if (f32 && forward_step.run_rows(ptr<float>(h), H, s.sizes[t], ptr<float>(hw), G * H)) continue;
    forward_step.run(h.narrow(0, 0, s.sizes[t]), hw.narrow(0, 0, s.sizes[t]));
  }
  at::Tensor dG = at::zeros({s.N, 4 * H}, opt), dh = at::empty({s.B, H}, opt), hp = at::zeros({s.N, H}, opt);
  const StepGemm backward_step = StepGemm::backward(w_hh, HG, s.B, s.T);
  GradGemms grad_gemms(Layout<Cell>::input_blocks(H), dG, HG, x, w_ih, hp, true, true, true, c10::nullopt,
                       c10::nullopt,
                       GradChunking::rows(x.device().is_cpu() && (x.scalar_type() == at::kFloat ||
                                                                   x.scalar_type() == at::kDouble),
                                          s.N, 4 * H * dG.element_size()));
  for (int64_t t = s.T - 1; t >= 0; --t) {
    const int64_t n = s.sizes[t], off = s.offsets[t];
    if (!(f32 && backward_step.run_rows(ptr<float>(dG) + off * 4 * H, 4 * H, n, ptr<float>(dh), H))) {
      backward_step.run(dG.narrow(0, off, n).narrow(1, 0, HG), dh.narrow(0, 0, n));
    }
    grad_gemms.rows_done(off, n);
  }
  grad_gemms.finish();
}

}  // namespace lrnn
