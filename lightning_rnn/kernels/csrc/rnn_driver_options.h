// The driver of one direction of one layer with cell options (layer norm, zoneout,
// recurrent dropout): the same structure as rnn_driver.h, the per-row math of
// rnn_options.h, and the semantics and saved tensors of kernels/reference/{lstm,gru}.py.
//
// Weight drop: W_hh * keep / (1 - p) is made once per call (and again in backward) from
// the raw weight and its bool mask, which is all that is saved; dW_hh goes through the mask.
//
// Forward: pre = x W_ih^T for all tokens (one GEMM; layer-normalized over its rows in one
// batched pass); per step hw = hbar W_hh^T (one GEMM; with layer norm written straight into
// the saved a_h rows) and one row pass (Opts::forward); with a projection, r W_hr^T and a
// pass for zoneout on h. Backward: one scan rebuilds c_t (LSTM) / h_{t-1} (GRU) and
// hbar_{t-1}; per step one row pass writes dG (the gate pre-activation gradients, state
// dtype) and dH (the recurrent side's, after its norm: the GEMM input), then dh_in = dH
// W_hh; after the loop the input norm's backward (x W_ih^T recomputed), dx, dW_ih, dW_hh,
// the biases and the norms' parameters as whole-matrix operations.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

#include "rnn_driver.h"
#include "rnn_options.h"
#include "rnn_options_scan.h"

namespace lrnn {

template <class Cell>
struct OptionsOf;
template <>
struct OptionsOf<LstmCell> {
  using type = LstmOptions;
};
template <>
struct OptionsOf<GruCell> {
  using type = GruOptions;
};

inline OptTensor defined_or_none(const at::Tensor& t) { return t.defined() ? OptTensor(t) : c10::nullopt; }

template <typename T>
const T* ptr_or_null(const OptTensor& t) {
  return t ? reinterpret_cast<const T*>(t->data_ptr()) : nullptr;
}

// The options of one call, checked against the sizes (norm: 4 tensors (ih w, b, hh w, b) for
// the GRU, 6 for the LSTM (and c w, b), or none).
struct CallOptions {
  std::vector<OptTensor> norm;
  OptTensor rec_keep, keep_c, keep_h, weight_keep;
  double rec_p = 0, p_c = 0, p_h = 0, weight_p = 0;

  bool layer_norm() const { return !norm.empty() && norm[0].has_value(); }

  void check(bool lstm, const Sizes& z, const at::Tensor& x) const {
    const int64_t GH = (lstm ? 4 : 3) * z.H;
    if (layer_norm()) {
      TORCH_CHECK(norm.size() == (lstm ? 6u : 4u), "norm: expected ", lstm ? 6 : 4, " tensors, got ", norm.size());
      for (size_t k = 0; k < norm.size(); ++k) {
        TORCH_CHECK(norm[k].has_value(), "norm: all or none of the layer norm's parameters");
        check_shape(*norm[k], "norm", {k < 4 ? GH : z.H});
        TORCH_CHECK(norm[k]->device() == x.device(), "norm: expected tensors on ", x.device());
      }
    }
    const auto mask = [&](const OptTensor& m, const char* name, at::IntArrayRef shape) {
      if (!m) return;
      TORCH_CHECK(m->scalar_type() == at::kBool && m->device() == x.device() && m->is_contiguous(), name,
                  ": expected a contiguous bool tensor on ", x.device());
      check_shape(*m, name, shape);
    };
    mask(rec_keep, "recurrent_keep", {z.B, z.P});
    mask(keep_c, "keep_c", {z.N, z.H});
    mask(keep_h, "keep_h", {z.N, z.P});
    mask(weight_keep, "weight_keep", {(lstm ? 4 : 3) * z.H, z.P});
    TORCH_CHECK(weight_p >= 0 && weight_p < 1, "weight_p: expected a value in [0, 1)");
    TORCH_CHECK(rec_p >= 0 && rec_p < 1 && p_c >= 0 && p_c < 1 && p_h >= 0 && p_h < 1,
                "probabilities: expected values in [0, 1)");
    TORCH_CHECK(!rec_keep || rec_p > 0, "recurrent_keep: given with recurrent_p = 0");
    TORCH_CHECK(lstm || !keep_c, "keep_c: a GRU has no cell state");
  }

  // W_hh with weight drop applied (w * keep / (1 - p)), in the compute dtype
  at::Tensor recurrent_weight(const at::Tensor& w_hh, at::ScalarType compute) const {
    if (!weight_keep) return w_hh.to(compute).contiguous();
    return (w_hh * weight_keep->to(w_hh.scalar_type()) / (1 - weight_p)).to(compute).contiguous();
  }

  // (B, P) keep / (1 - p) in the state dtype, or undefined
  at::Tensor rscale(const at::TensorOptions& sopt) const {
    return rec_keep ? rec_keep->to(sopt.dtype()) / (1 - rec_p) : at::Tensor();
  }
};

// ---- forward --------------------------------------------------------------------------
// Returns {out (N,P), h_n (B,P), c_n (B,H) LSTM / undefined, gates (N,4H), x_c (N,I),
// a_h (N,G*H) / undefined, stats_h (N,2) / undefined, stats_c (N,2) / undefined}.
template <class Cell, class Dev>
std::vector<at::Tensor> options_forward(const at::Tensor& x, const at::Tensor& batch_sizes, const at::Tensor& h0,
                                        const OptTensor& c0, const at::Tensor& w_ih, const at::Tensor& w_hh,
                                        const OptTensor& b_ih, const OptTensor& b_hh, const OptTensor& w_hr,
                                        bool reverse, at::ScalarType compute, at::ScalarType state,
                                        const CallOptions& o) {
  using Opts = typename OptionsOf<Cell>::type;
  constexpr bool kLstm = Cell::kProjGates == 4;
  TORCH_CHECK(x.device().type() == Dev::kDevice, "x: expected a tensor on ", Dev::kDevice, ", got ", x.device());
  const Schedule s(batch_sizes, reverse);
  const Sizes z = check_inputs<Cell>(x, s, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr);
  o.check(kLstm, z, x);
  const int64_t H = z.H, P = z.P, B = z.B, N = z.N, G = Cell::kProjGates, GH = G * H;
  const auto copt = x.options().dtype(compute), sopt = x.options().dtype(state);
  const bool proj = w_hr.has_value(), norm = o.layer_norm();

  at::Tensor x_c = x.to(compute).contiguous();
  at::Tensor pre = proj_gemm_pooled(x_c, w_ih.to(compute)).to(state).contiguous();  // (N, G*H)
  at::Tensor bias, b_hn;
  std::tie(bias, b_hn) = Layout<Cell>::fold_bias(b_ih, b_hh, H, sopt);
  const at::Tensor w_hh_c = o.recurrent_weight(w_hh, compute);
  std::vector<at::Tensor> norm_s;  // the norm parameters in the state dtype
  for (const OptTensor& t : o.norm) norm_s.push_back(t ? t->to(state).contiguous() : at::Tensor());
  const at::Tensor rscale = o.rscale(sopt);
  // the LSTM's gates over pre in place where both share a dtype (as rnn_driver.h): a row
  // pass reads each column of pre before it writes the gate there, and pre is not saved
  at::Tensor gates = kLstm && compute == state ? pre : BufferPool::empty({N, 4 * H}, copt);
  at::Tensor out = at::empty({N, P}, copt);
  at::Tensor h = h0.to(state).clone().contiguous();  // (B, P) the state h
  at::Tensor c = kLstm ? c0->to(state).clone().contiguous() : at::Tensor();
  at::Tensor ctil = kLstm ? at::empty({B, H}, sopt) : at::Tensor();
  at::Tensor htil = at::empty({B, std::max(H, P)}, sopt);  // scratch
  at::Tensor h_c = (rscale.defined() ? h * rscale : h).to(compute).contiguous();  // (B, P) GEMM input
  at::Tensor r = proj ? at::empty({B, H}, copt) : at::Tensor();
  at::Tensor a_h = norm ? BufferPool::empty({N, GH}, copt) : at::Tensor();  // hbar W_hh^T, saved
  at::Tensor hw = norm ? at::Tensor() : at::empty({B, GH}, copt);
  at::Tensor stats_h = norm ? at::empty({N, 2}, sopt) : at::Tensor();
  at::Tensor stats_c = norm && kLstm ? at::empty({N, 2}, sopt) : at::Tensor();
  const StepGemm step_gemm = StepGemm::forward(w_hh_c, B, s.T);
  const std::optional<StepGemm> project =
      proj ? std::optional<StepGemm>(StepGemm::forward(w_hr->to(compute), B, s.T)) : std::nullopt;
  dispatch_precision(compute, state, [&]<typename S, typename A>() {
    if (norm) Dev::template norm_rows<S, A>(pre, norm_s[0], norm_s[1]);  // LN_ih, every token's row at once
    for (int64_t k = 0; k < s.T; ++k) {
      const int64_t t = s.step(k), n = s.sizes[t], off = s.offsets[t];
      S* dst = norm ? ptr<S>(a_h) + off * GH : ptr<S>(hw);  // (n, G*H); views only off panels
      if (!step_gemm.run_rows(ptr<S>(h_c), P, n, dst, GH)) {
        at::Tensor rows = norm ? a_h.narrow(0, off, n) : hw.narrow(0, 0, n);
        const at::Tensor y = step_gemm.run(h_c.narrow(0, 0, n), rows);
        if (y.data_ptr() != rows.data_ptr()) rows.copy_(y);
      }
      OptFwdStep<S, A> step{ptr<A>(pre) + off * GH, dst, ptr<A>(bias), ptr<A>(b_hn),
                            norm ? ptr<A>(norm_s[2]) : nullptr, norm ? ptr<A>(norm_s[3]) : nullptr,
                            norm && kLstm ? ptr<A>(norm_s[4]) : nullptr, norm && kLstm ? ptr<A>(norm_s[5]) : nullptr,
                            norm ? ptr<A>(stats_h) + 2 * off : nullptr,
                            norm && kLstm ? ptr<A>(stats_c) + 2 * off : nullptr, ptr<S>(gates) + off * 4 * H,
                            kLstm ? ptr<A>(c) : nullptr, ptr<A>(h), kLstm ? ptr<A>(ctil) : nullptr, ptr<A>(htil),
                            ptr<S>(h_c),
                            proj ? ptr<S>(r) : ptr<S>(out) + off * P,
                            rscale.defined() ? ptr<A>(rscale) : nullptr,
                            o.keep_c ? ptr_or_null<uint8_t>(o.keep_c) + off * H : nullptr,
                            o.keep_h ? ptr_or_null<uint8_t>(o.keep_h) + off * P : nullptr,
                            A(o.p_c), A(o.p_h), proj, n, H, P, G};
      Dev::template options_forward<Opts, S, A>(step);
      if (proj) {  // h~ = r W_hr^T into the output rows, then zoneout on h and the GEMM input
        at::Tensor rows = out.narrow(0, off, n);
        const at::Tensor y = project->run(r.narrow(0, 0, n), rows);
        if (y.data_ptr() != rows.data_ptr()) rows.copy_(y);
        Dev::template options_finish<S, A>(ptr<A>(h), ptr<S>(rows), ptr<S>(h_c), ptr<A>(htil),
                                           rscale.defined() ? ptr<A>(rscale) : nullptr,
                                           o.keep_h ? ptr_or_null<uint8_t>(o.keep_h) + off * P : nullptr, n, P,
                                           A(o.p_h));
      }
    }
  });
  // h_n: the LSTM's in the compute dtype (a GEMM operand only) unless zoneout mixes it;
  // the GRU's in the state dtype, as its next step reads it (precision.py)
  const at::Tensor h_n = kLstm && o.p_h == 0 ? h.to(compute) : h;
  return {out, h_n, kLstm ? c : at::Tensor(), gates, x_c, a_h, stats_h, stats_c};
}

// ---- backward -------------------------------------------------------------------------
// needs = (x, h0, c0, w_ih, w_hh, bias, w_hr, norm). Returns {dx, dh0, dc0, dw_ih, dw_hh,
// db_ih, db_hh, dw_hr, d_norm...} (the norm's gradients in its order); undefined where not needed.
template <class Cell, class Dev>
std::vector<at::Tensor> options_backward(const at::Tensor& x_c, const at::Tensor& gates, const at::Tensor& h0,
                                         const OptTensor& c0, const at::Tensor& w_ih, const at::Tensor& w_hh,
                                         const OptTensor& w_hr, const at::Tensor& d_out, const at::Tensor& d_hn,
                                         const OptTensor& d_cn, const at::Tensor& batch_sizes, bool reverse,
                                         std::vector<bool> needs, at::ScalarType state,
                                         c10::optional<at::ScalarType> bias_dtype, const CallOptions& o,
                                         const OptTensor& a_h, const OptTensor& stats_h, const OptTensor& stats_c) {
  using Opts = typename OptionsOf<Cell>::type;
  constexpr bool kLstm = Cell::kProjGates == 4;
  TORCH_CHECK(x_c.device().type() == Dev::kDevice, "x_c: expected a tensor on ", Dev::kDevice);
  TORCH_CHECK(needs.size() == 8, "needs: expected 8 flags (x, h0, c0, w_ih, w_hh, bias, w_hr, norm)");
  const Schedule s(batch_sizes, reverse);
  const Sizes z = check_inputs<Cell>(x_c, s, h0, c0, w_ih, w_hh, c10::nullopt, c10::nullopt, w_hr);
  o.check(kLstm, z, x_c);
  const int64_t H = z.H, P = z.P, B = z.B, N = z.N, G = Cell::kProjGates, GH = G * H, HG = GH;
  const at::ScalarType compute = x_c.scalar_type();
  const auto copt = x_c.options().dtype(compute), sopt = x_c.options().dtype(state);
  const bool proj = w_hr.has_value(), norm = o.layer_norm();
  TORCH_CHECK(!norm || (a_h && stats_h && (!kLstm || stats_c)), "a_h, stats_h, stats_c: expected with layer norm");
  check_shape(d_out, "d_out", {N, P});
  check_shape(d_hn, "d_hn", {B, P});

  const at::Tensor gates_c = gates.contiguous();
  const at::Tensor d_out_c = d_out.to(compute).contiguous();
  const at::Tensor w_hh_c = o.recurrent_weight(w_hh, compute);
  const at::Tensor w_hr_c = proj ? w_hr->to(compute).contiguous() : at::Tensor();
  const at::Tensor h0_s = h0.to(state).contiguous();
  const at::Tensor c0_s = kLstm ? c0->to(state).contiguous() : at::Tensor();
  std::vector<at::Tensor> norm_s;
  for (const OptTensor& t : o.norm) norm_s.push_back(t ? t->to(state).contiguous() : at::Tensor());
  const at::Tensor rscale = o.rscale(sopt);
  const at::Tensor steps_dev = at::tensor(s.sizes).to(x_c.device());
  const at::Tensor offs_dev = at::tensor(s.offsets).to(x_c.device());

  // scratch of this call: BufferPool blocks, kept mapped between calls (rnn_pool.h)
  at::Tensor states = BufferPool::empty({N, H}, sopt);    // LSTM c_t / GRU h_{t-1}
  at::Tensor h_prev_c = BufferPool::empty({N, P}, copt);  // hbar_{t-1}: dW_hh's rows
  at::Tensor r_all = proj ? BufferPool::empty({N, H}, copt) : at::Tensor();
  at::Tensor carry = at::empty({B, P}, sopt);
  at::Tensor scratch = at::empty({B, std::max(H, P)}, sopt);
  at::Tensor dG = BufferPool::empty({N, 4 * H}, sopt);
  // the recurrent side's gradient: dG's first HG columns themselves where no norm or cast stands between
  const bool alias = !norm && compute == state;
  at::Tensor dH = alias ? dG.narrow(1, 0, HG) : BufferPool::empty({N, HG}, copt);
  const int64_t ldH = alias ? 4 * H : HG;
  at::Tensor dy = kLstm && norm ? at::empty({B, H}, sopt) : at::Tensor();  // scratch rows
  at::Tensor chat = kLstm && norm ? at::empty({B, H}, sopt) : at::Tensor();
  // Per batch row, the running sums of the parameters' gradients the passes add (OptBwdRow::db ...),
  // moved into float64 sums every kSumBlock steps: no float32 running sum spans more than
  // kSumBlock steps (a long sequence's bias gradient would drift, as in rnn_driver.h).
  constexpr int64_t kSumBlock = 32;
  std::vector<at::Tensor> sums{at::zeros({B, 4 * H}, sopt)};  // db
  if (norm) sums.push_back(at::zeros({B, HG}, sopt));         // the recurrent norm's gain
  if (norm && kLstm) {                                        // the cell norm's gain and bias
    sums.push_back(at::zeros({B, H}, sopt));
    sums.push_back(at::zeros({B, H}, sopt));
  }
  std::vector<at::Tensor> totals;
  for (const at::Tensor& t : sums) totals.push_back(at::zeros(t.sizes(), sopt.dtype(at::kDouble)));
  at::Tensor dh = proj ? at::Tensor() : d_hn.to(state).clone().contiguous();
  at::Tensor carry_p = proj ? d_hn.to(state).clone().contiguous() : at::Tensor();  // (B, P) projected dh carry
  at::Tensor d_proj = proj ? at::empty({N, P}, copt) : at::Tensor();  // dh~ of every token: dW_hr's rows
  at::Tensor dr = proj ? at::empty({B, H}, copt) : at::Tensor();
  at::Tensor dc = kLstm ? d_cn->to(state).clone().contiguous() : at::Tensor();
  at::Tensor dh_in = at::zeros({B, P}, copt);
  const StepGemm step_gemm = StepGemm::backward(w_hh_c, HG, B, s.T);
  const std::optional<StepGemm> unproject =
      proj ? std::optional<StepGemm>(StepGemm::backward(w_hr_c, P, B, s.T)) : std::nullopt;

  dispatch_precision(compute, state, [&]<typename S, typename A>() {
    OptScanArgs<S, A> scan{ptr<S>(gates_c), ptr<A>(h0_s), kLstm ? ptr<A>(c0_s) : nullptr,
                           norm && kLstm ? ptr_or_null<A>(stats_c) : nullptr,
                           norm && kLstm ? ptr<A>(norm_s[4]) : nullptr, norm && kLstm ? ptr<A>(norm_s[5]) : nullptr,
                           rscale.defined() ? ptr<A>(rscale) : nullptr, ptr_or_null<uint8_t>(o.keep_c),
                           ptr_or_null<uint8_t>(o.keep_h), A(o.p_c), A(o.p_h), ptr<A>(states), ptr<S>(h_prev_c),
                           proj ? ptr<S>(r_all) : nullptr, ptr<A>(carry), ptr<A>(scratch), ptr<int64_t>(steps_dev),
                           ptr<int64_t>(offs_dev), s.T, H, P, s.reverse, proj};
    Dev::template options_scan<kLstm, S, A>(scan, B);
    if (proj) {  // h~_t = r_t W_hr^T for every token, then hbar_{t-1} through zoneout on h
      const at::Tensor htil = proj_gemm(r_all, w_hr_c);
      Dev::template options_projected_scan<S, A>(scan, ptr<S>(htil.contiguous()), B);
    }
    int64_t m_in = 0;
    for (int64_t k = s.T - 1; k >= 0; --k) {
      const int64_t t = s.step(k), n = s.sizes[t], off = s.offsets[t], p = s.prev(t);
      const S* d_rows = ptr<S>(d_out_c) + off * P;
      if (proj) {  // dh_t = carry + dh_in * rscale + d_out (n, P); zoneout keeps a share; dr = dh~ W_hr
        at::Tensor carry_n = carry_p.narrow(0, 0, n);
        carry_n.add_(d_out_c.narrow(0, off, n).to(state));
        const int64_t m = std::min(m_in, n);
        if (m) {
          at::Tensor in = dh_in.narrow(0, 0, m).to(state);
          carry_p.narrow(0, 0, m).add_(rscale.defined() ? in * rscale.narrow(0, 0, m) : in);
        }
        at::Tensor kept = at::zeros_like(carry_n);
        if (o.p_h > 0) {
          kept = o.keep_h ? at::where(o.keep_h->narrow(0, off, n), carry_n, at::zeros_like(carry_n))
                          : carry_n * o.p_h;
        }
        at::Tensor dht = d_proj.narrow(0, off, n);
        dht.copy_(carry_n - kept);
        carry_n.copy_(kept);
        at::Tensor dr_n = dr.narrow(0, 0, n);
        const at::Tensor y = unproject->run(dht, dr_n);
        if (y.data_ptr() != dr_n.data_ptr()) dr_n.copy_(y);
        d_rows = ptr<S>(dr);
      }
      const A* prev = kLstm ? (p < 0 ? nullptr : ptr<A>(states) + s.offsets[p] * H) : ptr<A>(states) + off * H;
      const int64_t m_prev = kLstm ? (p < 0 ? 0 : s.sizes[p]) : n;
      OptBwdStep<S, A> step{ptr<S>(gates_c) + off * 4 * H, prev, kLstm ? ptr<A>(c0_s) : prev, m_prev,
                            norm && kLstm ? ptr_or_null<A>(stats_c) + 2 * off : nullptr,
                            norm ? ptr_or_null<A>(stats_h) + 2 * off : nullptr,
                            norm ? ptr_or_null<S>(a_h) + off * GH : nullptr,
                            norm ? ptr<A>(norm_s[2]) : nullptr, norm && kLstm ? ptr<A>(norm_s[4]) : nullptr,
                            norm && kLstm ? ptr<A>(norm_s[5]) : nullptr, d_rows, ptr<S>(dh_in), m_in,
                            rscale.defined() ? ptr<A>(rscale) : nullptr,
                            o.keep_c ? ptr_or_null<uint8_t>(o.keep_c) + off * H : nullptr,
                            o.keep_h ? ptr_or_null<uint8_t>(o.keep_h) + off * P : nullptr, A(o.p_c), A(o.p_h),
                            proj ? nullptr : ptr<A>(dh), kLstm ? ptr<A>(dc) : nullptr, ptr<A>(dG) + off * 4 * H,
                            alias ? nullptr : ptr<S>(dH) + off * HG, dy.defined() ? ptr<A>(dy) : nullptr,
                            chat.defined() ? ptr<A>(chat) : nullptr, ptr<A>(scratch), ptr<A>(sums[0]),
                            norm ? ptr<A>(sums[1]) : nullptr, norm && kLstm ? ptr<A>(sums[2]) : nullptr,
                            norm && kLstm ? ptr<A>(sums[3]) : nullptr, proj, n, H, P, G, HG};
      Dev::template options_backward<Opts, S, A>(step);
      if (!step_gemm.run_rows(ptr<S>(dH) + off * ldH, ldH, n, ptr<S>(dh_in), P)) {
        at::Tensor dh_in_n = dh_in.narrow(0, 0, n);
        const at::Tensor y = step_gemm.run(dH.narrow(0, off, n), dh_in_n);
        if (y.data_ptr() != dh_in_n.data_ptr()) dh_in_n.copy_(y);
      }
      m_in = n;
      if ((s.T - k) % kSumBlock == 0) {
        for (size_t i = 0; i < sums.size(); ++i) {
          totals[i].add_(sums[i]);
          sums[i].zero_();
        }
      }
    }
  });
  std::vector<at::Tensor> sum;  // the parameters' gradients summed over rows and steps
  for (size_t i = 0; i < sums.size(); ++i) sum.push_back(totals[i].add_(sums[i]).sum(0).to(state));

  std::vector<at::Tensor> grads(8 + o.norm.size());
  // The first step's GEMM result is h0's share: dh0 = carry + dh_in * rscale
  at::Tensor in = dh_in.to(state);
  if (rscale.defined()) in = in * rscale;
  if (needs[1]) grads[1] = ((proj ? carry_p : dh) + in).to(h0.scalar_type());
  if (needs[2] && kLstm) grads[2] = dc.to(c0->scalar_type());
  // the input side [dr, dz, dn] of the GRU's [dr, dz, dhn, dn]; the LSTM's whole dG; the
  // biases' gradients alike (the norms' biases have the same: they are added with them)
  const at::Tensor dGx = kLstm ? dG : at::cat({dG.narrow(1, 0, 2 * H), dG.narrow(1, 3 * H, H)}, 1);
  const at::Tensor db_x = kLstm ? sum[0] : at::cat({sum[0].narrow(0, 0, 2 * H), sum[0].narrow(0, 3 * H, H)});
  const at::Tensor db_h = sum[0].narrow(0, 0, HG);
  const at::Tensor w_ih_c = w_ih.to(compute);
  at::Tensor dAx_c;  // the input side's gradient before LN_ih, in the compute dtype
  dispatch_precision(compute, state, [&]<typename S, typename A>() {
    if (norm) {  // back through LN_ih, with x W_ih^T recomputed for all tokens (one GEMM)
      at::Tensor a_x = proj_gemm_pooled(x_c, w_ih_c).to(state).contiguous();
      at::Tensor dw_norm;
      std::tie(dAx_c, dw_norm) = Dev::template norm_rows_backward<S, A>(dGx, a_x, norm_s[0]);
      if (needs[7]) {
        const auto as = [&](const at::Tensor& g, int k) { return g.to(o.norm[k]->scalar_type()); };
        grads[8] = as(dw_norm, 0);
        grads[9] = as(db_x, 1);
        grads[10] = as(sum[1], 2);
        grads[11] = as(db_h, 3);
        if (kLstm) {
          grads[12] = as(sum[2], 4);
          grads[13] = as(sum[3], 5);
        }
      }
    } else {
      dAx_c = dGx.to(compute).contiguous();
    }
  });
  if (needs[0]) grads[0] = input_grad_gemm(dAx_c, w_ih_c, w_ih);
  if (needs[3]) grads[3] = wgrad_gemm(dAx_c, x_c).to(w_ih.scalar_type());
  if (needs[4]) {  // the dropped weight's gradient, through the mask to the raw W_hh
    at::Tensor dw = wgrad_gemm(dH, h_prev_c);
    if (o.weight_keep) dw = dw * o.weight_keep->to(dw.scalar_type()) / (1 - o.weight_p);
    grads[4] = dw.to(w_hh.scalar_type());
  }
  if (needs[5] && bias_dtype) {
    grads[5] = db_x.to(*bias_dtype);
    grads[6] = db_h.to(*bias_dtype);
  }
  if (needs[6] && proj) grads[7] = wgrad_gemm(d_proj, r_all).to(w_hr->scalar_type());
  return grads;
}

// The Python entry points: the options as separate arguments (norm: a list of tensors or
// Nones), as the extension binds them (the GRU's c0, w_hr and keep_c are None).
template <class Cell, class Dev>
std::vector<at::Tensor> options_forward_entry(const at::Tensor& x, const at::Tensor& batch_sizes,
                                              const at::Tensor& h0, const OptTensor& c0, const at::Tensor& w_ih,
                                              const at::Tensor& w_hh, const OptTensor& b_ih, const OptTensor& b_hh,
                                              const OptTensor& w_hr, bool reverse, at::ScalarType compute,
                                              at::ScalarType state, const std::vector<OptTensor>& norm,
                                              const OptTensor& rec_keep, double rec_p, double p_c, double p_h,
                                              const OptTensor& keep_c, const OptTensor& keep_h,
                                              const OptTensor& weight_keep, double weight_p) {
  const CallOptions o{norm, rec_keep, keep_c, keep_h, weight_keep, rec_p, p_c, p_h, weight_p};
  return options_forward<Cell, Dev>(x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse, compute, state, o);
}

template <class Cell, class Dev>
std::vector<at::Tensor> options_backward_entry(
    const at::Tensor& x_c, const at::Tensor& gates, const at::Tensor& h0, const OptTensor& c0, const at::Tensor& w_ih,
    const at::Tensor& w_hh, const OptTensor& w_hr, const at::Tensor& d_out, const at::Tensor& d_hn,
    const OptTensor& d_cn, const at::Tensor& batch_sizes, bool reverse, std::vector<bool> needs,
    at::ScalarType state, c10::optional<at::ScalarType> bias_dtype, const std::vector<OptTensor>& norm,
    const OptTensor& rec_keep, double rec_p, double p_c, double p_h, const OptTensor& keep_c, const OptTensor& keep_h,
    const OptTensor& weight_keep, double weight_p, const OptTensor& a_h, const OptTensor& stats_h,
    const OptTensor& stats_c) {
  const CallOptions o{norm, rec_keep, keep_c, keep_h, weight_keep, rec_p, p_c, p_h, weight_p};
  return options_backward<Cell, Dev>(x_c, gates, h0, c0, w_ih, w_hh, w_hr, d_out, d_hn, d_cn, batch_sizes, reverse,
                                     std::move(needs), state, bias_dtype, o, a_h, stats_h, stats_c);
}

}  // namespace lrnn
