// One direction of one layer as a C++ autograd node: the driver's forward and backward
// (rnn_driver.h) recorded by autograd without a Python autograd.Function.
//
// Why a C++ node: a Python autograd.Function (kernels/extension/autograd.py) adds its apply,
// ctx, saving and a Python backward to every call, a fixed cost that is a visible share of
// a small layer's time. This node is what the autograd.py wrappers call in the common
// case, a plain forward + backward. The
// Python Function stays for what it does in Python: a backward inside gradient
// checkpointing's GradSink and forward-mode AD (refused there with a clear error).
// A backward with create_graph=True calls back into Python (autograd.py:
// graph_backward), which differentiates a graph of torch ops, as the Function does.
//
// Inputs (apply): x (N, I) already in the compute dtype, batch_sizes, h0, c0 (LSTM),
// w_ih, w_hh, b_ih, b_hh, w_hr (the LSTM's projection), reverse, compute and state
// dtypes; returns (out, h_n, c_n) for the LSTM, (out, h_n) for the GRU. Saved: x, the
// gates, h0, c0 and the weights, as the Function saves them.
#pragma once

#include <torch/csrc/autograd/custom_function.h>
#include <torch/extension.h>

#include <array>
#include <optional>
#include <vector>

#include "rnn_driver.h"

namespace lrnn {

// The Python gradients of a create_graph backward: functions.graph_backward(cell, inputs,
// needs, grads, x_is_input) with inputs in this node's order (x, batch_sizes, h0, c0,
// w_ih, w_hh, b_ih, b_hh, w_hr, reverse) and one gradient (or None) back per input.
inline std::vector<at::Tensor> python_graph_backward(const char* cell, const std::vector<at::Tensor>& saved,
                                                     const at::Tensor& batch_sizes, bool reverse,
                                                     const std::vector<bool>& needs,
                                                     const std::vector<at::Tensor>& grads, bool x_is_input) {
  py::gil_scoped_acquire gil;
  const auto optional = [](const at::Tensor& t) { return t.defined() ? py::cast(t) : py::none(); };
  // saved: x, gates, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr
  py::tuple inputs = py::make_tuple(saved[0], batch_sizes, saved[2], optional(saved[3]), saved[4], saved[5],
                                    optional(saved[6]), optional(saved[7]), optional(saved[8]), reverse);
  py::object fn = py::module_::import("lightning_rnn.kernels.extension.autograd").attr("graph_backward");
  py::object out = fn(cell, inputs, needs, grads, x_is_input);
  std::vector<at::Tensor> result;
  for (const py::handle g : out) result.push_back(g.is_none() ? at::Tensor() : g.cast<at::Tensor>());
  return result;
}

// Guard: what the entry points run under (the CPU's flushed denormals, the GPU's device),
// constructed from x; the ATen calls inside always dispatch below autograd and autocast.
template <class Cell, class Dev, class Guard>
struct CellNode : public torch::autograd::Function<CellNode<Cell, Dev, Guard>> {
  using variable_list = torch::autograd::variable_list;
  using Ctx = torch::autograd::AutogradContext;
  static constexpr bool kLstm = Cell::kProjGates == 4;
  // positions of apply's arguments (and of backward's gradients)
  enum Arg { kX, kBatchSizes, kH0, kC0, kWih, kWhh, kBih, kBhh, kWhr, kReverse, kCompute, kState, kArgs };

  struct Scope {
    explicit Scope(const at::Tensor& x) : guard(x) {}
    Guard guard;
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    c10::impl::ExcludeDispatchKeyGuard no_autocast{c10::autocast_dispatch_keyset};  // GEMMs cast by hand
  };

  static variable_list forward(Ctx* ctx, const at::Tensor& x, const at::Tensor& batch_sizes, const at::Tensor& h0,
                               const OptTensor& c0, const at::Tensor& w_ih, const at::Tensor& w_hh,
                               const OptTensor& b_ih, const OptTensor& b_hh, const OptTensor& w_hr, bool reverse,
                               at::ScalarType compute, at::ScalarType state) {
    std::vector<at::Tensor> r;  // out, h_n, c_n, gates, x_c
    {
      Scope scope(x);
      r = rnn_forward<Cell, Dev>(x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse, compute, state);
    }
    const auto value = [](const OptTensor& t) { return t ? *t : at::Tensor(); };
    ctx->save_for_backward({r[4], r[3], h0, value(c0), w_ih, w_hh, value(b_ih), value(b_hh), value(w_hr)});
    ctx->saved_data["batch_sizes"] = batch_sizes;
    ctx->saved_data["reverse"] = reverse;
    ctx->saved_data["state"] = state;
    ctx->saved_data["x_is_input"] = r[4].is_same(x);
    if (kLstm) return {r[0], r[1], r[2]};
    return {r[0], r[1]};
  }

  // Which tensor arguments up to w_hr are autograd inputs (edges), numbered as
  // Function::apply numbers them (-1: None, no edge): the optional ones are those saved.
  static std::array<int64_t, kReverse> edges(const std::vector<at::Tensor>& saved) {
    // saved: x, gates, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr; the arguments' places in it
    constexpr std::array<int, kReverse> kSaved{0, -1, 2, 3, 4, 5, 6, 7, 8};  // -1: batch_sizes
    std::array<int64_t, kReverse> edge{};
    int64_t next = 0;
    for (int a = 0; a < kReverse; ++a) edge[a] = kSaved[a] < 0 || saved[kSaved[a]].defined() ? next++ : -1;
    return edge;
  }

  static variable_list backward(Ctx* ctx, variable_list grads) {
    const std::vector<at::Tensor> saved = ctx->get_saved_variables();
    const std::array<int64_t, kReverse> edge = edges(saved);
    const auto needs = [&](Arg a) { return edge[a] >= 0 && ctx->needs_input_grad(edge[a]); };
    const at::Tensor batch_sizes = ctx->saved_data["batch_sizes"].toTensor();
    const bool reverse = ctx->saved_data["reverse"].toBool();
    variable_list out(kArgs);
    if (at::GradMode::is_enabled()) {  // create_graph=True: gradients that can be differentiated again
      std::vector<bool> need;
      for (int a = 0; a < kReverse; ++a) need.push_back(needs(static_cast<Arg>(a)));
      const auto g = python_graph_backward(kLstm ? "lstm" : "gru", saved, batch_sizes, reverse, need, grads,
                                           ctx->saved_data["x_is_input"].toBool());
      for (int a = 0; a < kReverse; ++a) out[a] = g[a];
      return out;
    }
    const at::Tensor &x_c = saved[0], &gates = saved[1], &h0 = saved[2], &w_ih = saved[4], &w_hh = saved[5];
    const OptTensor c0 = saved[3].defined() ? OptTensor(saved[3]) : c10::nullopt;
    const OptTensor w_hr = saved[8].defined() ? OptTensor(saved[8]) : c10::nullopt;
    const OptTensor d_cn = kLstm ? OptTensor(grads[2]) : c10::nullopt;
    const auto bias_dtype = saved[6].defined() ? c10::optional<at::ScalarType>(saved[6].scalar_type()) : c10::nullopt;
    // (x, h0, c0, w_ih, w_hh, bias, w_hr), as rnn_backward takes them
    std::vector<bool> want{needs(kX),   needs(kH0),  needs(kC0),           needs(kWih),
                           needs(kWhh), needs(kBih) || needs(kBhh), needs(kWhr)};
    std::vector<at::Tensor> g;  // dx, dh0, dc0, dw_ih, dw_hh, db_ih, db_hh, dw_hr
    {
      Scope scope(x_c);
      g = rnn_backward<Cell, Dev>(x_c, gates, h0, c0, w_ih, w_hh, w_hr, grads[0], grads[1], d_cn, batch_sizes,
                                  reverse, want, ctx->saved_data["state"].toScalarType(), bias_dtype, c10::nullopt,
                                  c10::nullopt);
    }
    out[kX] = g[0];
    out[kH0] = g[1];
    if (c0) out[kC0] = g[2];
    out[kWih] = g[3];
    out[kWhh] = g[4];
    if (bias_dtype) out[kBih] = g[5], out[kBhh] = g[6];
    if (w_hr) out[kWhr] = g[7];
    return out;
  }

  // The Python entry point: (out, h_n[, c_n]) connected to this node.
  static std::vector<at::Tensor> run(const at::Tensor& x, const at::Tensor& batch_sizes, const at::Tensor& h0,
                                     const OptTensor& c0, const at::Tensor& w_ih, const at::Tensor& w_hh,
                                     const OptTensor& b_ih, const OptTensor& b_hh, const OptTensor& w_hr,
                                     bool reverse, at::ScalarType compute, at::ScalarType state) {
    return CellNode::apply(x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse, compute, state);
  }
};

// A whole stack, layer after layer (both directions of a layer, their outputs joined),
// in one call from Python: a node per layer-direction (CellNode) as above, and no Python
// between them, so the per-layer Python (a wrapper, the precision, the states' views) is
// not paid once per layer-direction. x (N, I) in the
// compute dtype; h0 (L*D, B, P), c0 (L*D, B, H) (LSTM) or None (GRU); weights: 5 per
// layer-direction as the layers give them (w_ih, w_hh, b_ih, b_hh, w_hr; None where
// absent). Returns (out (N, D*P), h_n (L*D, B, P)[, c_n (L*D, B, H)]). Inter-layer
// dropout is the caller's (the layers take this path without it).
template <class Cell, class Dev, class Guard>
std::vector<at::Tensor> stack_apply(const at::Tensor& x, const at::Tensor& batch_sizes, const at::Tensor& h0,
                                    const OptTensor& c0, const std::vector<OptTensor>& weights, int64_t L, int64_t D,
                                    at::ScalarType compute, at::ScalarType state) {
  using Node = CellNode<Cell, Dev, Guard>;
  TORCH_CHECK(L >= 1 && (D == 1 || D == 2), "stack: expected layers >= 1 and 1 or 2 directions, got ", L, ", ", D);
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == 5 * L * D, "weights: expected 5 per layer-direction (",
              5 * L * D, "), got ", weights.size());
  TORCH_CHECK(Node::kLstm == c0.has_value(), "c0: expected ", Node::kLstm ? "a tensor (LSTM)" : "None (GRU)");
  TORCH_CHECK(h0.dim() == 3 && h0.size(0) == L * D, "h0: expected (", L * D, ", batch, size), got ", h0.sizes());
  at::Tensor input = x;
  std::vector<at::Tensor> hs, cs;
  for (int64_t layer = 0; layer < L; ++layer) {
    std::vector<at::Tensor> outs;
    for (int64_t d = 0; d < D; ++d) {
      const int64_t k = layer * D + d;
      const OptTensor* w = &weights[5 * k];
      TORCH_CHECK(w[0] && w[1], "weights: w_ih and w_hh of layer-direction ", k, " are None");
      const OptTensor c = c0 ? OptTensor(c0->select(0, k)) : c10::nullopt;
      std::vector<at::Tensor> r = Node::apply(input, batch_sizes, h0.select(0, k), c, *w[0], *w[1], w[2], w[3], w[4],
                                              d == 1, compute, state);
      outs.push_back(r[0]);
      hs.push_back(r[1]);
      if (c0) cs.push_back(r[2]);
    }
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);  // a join casts nothing
    input = D == 1 ? outs[0] : at::cat(outs, 1);
  }
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const auto join = [](const std::vector<at::Tensor>& s) { return s.size() == 1 ? s[0].unsqueeze(0) : at::stack(s); };
  std::vector<at::Tensor> result{input, join(hs)};
  if (c0) result.push_back(join(cs));
  return result;
}

// The layers' common call, in one step from Python: a padded, time-major x (T, B, I) in
// the compute dtype (here also the state dtype: no autocast), the initial states h0
// (L*D, B, P) and the LSTM's c0 (L*D, B, H), or None for zeros, the weights as for
// stack_apply. The batch sizes, the zero states and the views are made here, where each
// is a C++ call, rather than in Python, where each is a trip through the interpreter and
// the dispatcher. Returns
// (out (T, B, D*P), h_n (L*D, B, P)[, c_n (L*D, B, H)]).
template <class Cell, class Dev, class Guard>
std::vector<at::Tensor> padded_stack_apply(const at::Tensor& x, const OptTensor& h0, const OptTensor& c0,
                                           const std::vector<OptTensor>& weights, int64_t L, int64_t D) {
  constexpr bool kLstm = CellNode<Cell, Dev, Guard>::kLstm;
  TORCH_CHECK(x.dim() == 3 && x.size(0) > 0 && x.size(1) > 0, "x: expected (T, B, I) with T, B > 0, got ", x.sizes());
  TORCH_CHECK(!weights.empty() && weights[1], "weights: expected w_hh of the first layer-direction");
  TORCH_CHECK(kLstm ? h0.has_value() == c0.has_value() : !c0.has_value(),
              "h0, c0: expected both or neither (LSTM), c0 None (GRU)");
  const int64_t T = x.size(0), B = x.size(1);
  const at::Tensor& w_hh = *weights[1];
  const int64_t H = w_hh.size(0) / Cell::kProjGates, P = w_hh.size(1);
  const at::Tensor h = h0 ? *h0 : at::zeros({L * D, B, P}, x.options());
  OptTensor c = c0;
  if (kLstm && !c) c = P == H ? h : at::zeros({L * D, B, H}, x.options());  // h: zeros here too
  const at::Tensor batch_sizes = at::full({T}, B, at::TensorOptions().dtype(at::kLong));  // on the host
  std::vector<at::Tensor> result = stack_apply<Cell, Dev, Guard>(x.reshape({T * B, x.size(2)}), batch_sizes, h, c,
                                                                 weights, L, D, x.scalar_type(), x.scalar_type());
  result[0] = result[0].view({T, B, result[0].size(1)});
  return result;
}

// The extension's autograd entry points for a device (Dev) and what its calls run under
// (Guard): lstm_apply / gru_apply (one layer-direction), lstm_stack / gru_stack (a
// stack) and lstm_padded / gru_padded (a stack's common call), all without the GIL, as
// the kernels' other entry points.
template <class Dev, class Guard>
void def_autograd_entry_points(py::module_& m) {
  const auto nogil = py::call_guard<py::gil_scoped_release>();
  m.def("lstm_apply", &CellNode<LstmCell, Dev, Guard>::run,
        "LSTM forward of one layer-direction recorded by autograd as one C++ node", nogil);
  m.def("gru_apply", &CellNode<GruCell, Dev, Guard>::run,
        "GRU forward of one layer-direction recorded by autograd as one C++ node", nogil);
  m.def("lstm_stack", &stack_apply<LstmCell, Dev, Guard>,
        "an LSTM stack's forward, one C++ autograd node per layer-direction", nogil);
  m.def("gru_stack", &stack_apply<GruCell, Dev, Guard>,
        "a GRU stack's forward, one C++ autograd node per layer-direction", nogil);
  m.def("lstm_padded", &padded_stack_apply<LstmCell, Dev, Guard>,
        "an LSTM stack's forward on a padded batch (lstm_stack's common call)", nogil);
  m.def("gru_padded", &padded_stack_apply<GruCell, Dev, Guard>,
        "a GRU stack's forward on a padded batch (gru_stack's common call)", nogil);
}

}  // namespace lrnn
