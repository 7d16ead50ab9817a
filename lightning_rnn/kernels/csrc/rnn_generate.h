// Token-by-token generation for a character language model, the whole loop in C++: per
// step and for each of B sequences, a token is drawn from the logits (temperature, top-k,
// top-p, then a categorical draw from a torch.Generator), its embedding row is read, every
// layer's cell runs (the element math of rnn_cells.h, as in the training kernels), and the
// output projection gives the next logits. Nothing returns to Python between steps.
//
// At the few rows of generation every product is a matrix-vector product whose cost is
// reading the weights, so each weight is read once per step: a layer's [W_ih | W_hh] is
// one (G*H, I + P) matrix (concatenated once by the caller), stored in column panels
// (pack_panels) so that one pass over a panel gives both x W_ih^T and h W_hh^T for its
// rows, kept apart because the GRU's r multiplies W_hn h alone; the panel is read for
// every sequence while it is in cache. Weights are float32 or bfloat16 (half the bytes to
// read, widened to float32 as they are loaded); sums, states and logits are float32.
//
// Shapes: embedding (V_in, E) float32 with V_in >= V; per layer l: w (G*H, I_l + P) in
// panels with I_0 = E and I_l = P above, bias (G*H) float32 folded as the driver folds it (LSTM:
// b_ih + b_hh; GRU: [b_ir + b_hr, b_iz + b_hz, b_in]), b_hn (H) float32 (GRU only), w_hr
// (P, H) in panels (an LSTM with a projection; P = H without one); w_out (V, P) in panels,
// b_out (V) float32.
// State h (L, B, P), c (L, B, H) (LSTM) and logits (B, V), float32, are updated in place.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "rnn_cells.h"
#include "rnn_draw.h"

namespace lrnn {

// ---- matrix-vector products ---------------------------------------------------------
#if defined(__AVX512F__)
constexpr int64_t kGenLanes = 16;
#else
constexpr int64_t kGenLanes = 8;
#endif
typedef float GenVec __attribute__((vector_size(kGenLanes * sizeof(float))));
typedef uint16_t GenBf16Bits __attribute__((vector_size(kGenLanes * sizeof(uint16_t))));
typedef uint32_t GenFloatBits __attribute__((vector_size(kGenLanes * sizeof(uint32_t))));

inline GenVec load_weights(const float* p) {
  GenVec v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// bfloat16 is the top half of a float32: widening is a shift of the bits.
inline GenVec load_weights(const c10::BFloat16* p) {
  GenBf16Bits raw;
  std::memcpy(&raw, p, sizeof(raw));
  const GenFloatBits wide = __builtin_convertvector(raw, GenFloatBits) << 16;
  GenVec v;
  std::memcpy(&v, &wide, sizeof(v));
  return v;
}

// A matrix W (rows, K) as the products read it: rows padded with zeros to a multiple of
// kGenLanes, in blocks of up to kPanelVectors vectors of rows, each block stored as a
// panel (K, width) row-major, the blocks one after another. A block's product is then
// width / kGenLanes independent vector sums over k, each step one broadcast of x[k] and
// one load and FMA per vector: no horizontal sums, and the panel is one contiguous stream.
constexpr int64_t kPanelVectors = 8;  // 8 sums in flight: two FMA units of four cycles' latency
constexpr int64_t kPanelRows = kPanelVectors * kGenLanes;

inline int64_t padded_rows(int64_t rows) { return (rows + kGenLanes - 1) / kGenLanes * kGenLanes; }

// w (rows, K) float32 or bfloat16 -> the panels (padded_rows(rows) * K,) in w's dtype.
inline at::Tensor pack_panels(const at::Tensor& w) {
  const bool dtype = w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16;
  TORCH_CHECK(w.dim() == 2 && w.device().is_cpu() && dtype,
              "w: expected a 2-D float32 or bfloat16 CPU matrix, got ", w.toString(), " of shape ", w.sizes());
  const int64_t rows = w.size(0), K = w.size(1), padded = padded_rows(rows);
  at::Tensor full = at::zeros({padded, K}, w.options());
  full.narrow(0, 0, rows).copy_(w);
  std::vector<at::Tensor> panels;
  for (int64_t r0 = 0; r0 < padded; r0 += kPanelRows) {
    panels.push_back(full.narrow(0, r0, std::min(kPanelRows, padded - r0)).t().contiguous().view(-1));
  }
  return at::cat(panels);
}

// y[c] = sum_k x[k] panel[k][c] over k < K for the first `cols` of the NV * kGenLanes
// columns c of one panel (row stride ld).
template <int NV, typename W>
inline void panel_product(const W* panel, int64_t ld, const float* x, int64_t K, float* y, int64_t cols) {
  GenVec acc[NV];
  for (int v = 0; v < NV; ++v) acc[v] = GenVec{};
  for (int64_t k = 0; k < K; ++k) {
    const GenVec xk = GenVec{} + x[k];
    const W* row = panel + k * ld;
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[v] += load_weights(row + v * kGenLanes) * xk;
  }
  std::memcpy(y, acc, cols * sizeof(float));  // acc's vectors lie one after another
}

template <typename W>
inline void panel_product_any(int64_t vectors, const W* panel, const float* x, int64_t K, float* y, int64_t cols) {
  const int64_t ld = vectors * kGenLanes;
  switch (vectors) {
    case 8: return panel_product<8>(panel, ld, x, K, y, cols);
    case 7: return panel_product<7>(panel, ld, x, K, y, cols);
    case 6: return panel_product<6>(panel, ld, x, K, y, cols);
    case 5: return panel_product<5>(panel, ld, x, K, y, cols);
    case 4: return panel_product<4>(panel, ld, x, K, y, cols);
    case 3: return panel_product<3>(panel, ld, x, K, y, cols);
    case 2: return panel_product<2>(panel, ld, x, K, y, cols);
    default: return panel_product<1>(panel, ld, x, K, y, cols);
  }
}

// For W (rows, Kx + Kh) packed by pack_panels and each sequence b < B:
//   y_x[b * ldy + r] = W[r][0:Kx) . x[b]   and, where Kh > 0,   y_h[b * ldy + r] = W[r][Kx:Kx+Kh) . h[b].
// Panels go to threads one by one where W is large (1 MB or more); a smaller product
// stays on the calling thread, where a hand-off would cost more than it saves.
template <typename W>
void gemv(const W* w, int64_t rows, int64_t Kx, int64_t Kh, const std::vector<const float*>& x,
          const std::vector<const float*>& h, float* y_x, float* y_h, int64_t ldy) {
  static_assert(kPanelVectors == 8, "panel_product_any covers 1 to 8 vectors");
  const int64_t K = Kx + Kh, B = static_cast<int64_t>(x.size()), padded = padded_rows(rows);
  const int64_t blocks = (padded + kPanelRows - 1) / kPanelRows;
  const bool large = padded * K * static_cast<int64_t>(sizeof(W)) >= (int64_t(1) << 20);
  at::parallel_for(0, blocks, large ? 1 : blocks, [&](int64_t first, int64_t last) {
    for (int64_t block = first; block < last; ++block) {
      const int64_t r0 = block * kPanelRows, width = std::min(kPanelRows, padded - r0);
      const int64_t vectors = width / kGenLanes, cols = std::min(width, rows - r0);
      const W* panel = w + r0 * K;
      for (int64_t b = 0; b < B; ++b) {
        panel_product_any(vectors, panel, x[b], Kx, y_x + b * ldy + r0, cols);
        if (Kh) panel_product_any(vectors, panel + Kx * width, h[b], Kh, y_h + b * ldy + r0, cols);
      }
    }
  });
}

// ---- the loop -------------------------------------------------------------------------
template <typename W>
const W* weights_of(const at::Tensor& t) {
  return reinterpret_cast<const W*>(t.data_ptr());
}

struct GenerationShapes {
  int64_t L, B, E, H, P, V, G;
};

template <class Cell>
GenerationShapes check_generation(const at::Tensor& embedding, const std::vector<at::Tensor>& weights,
                                  const std::vector<at::Tensor>& biases, const std::vector<at::Tensor>& b_hn,
                                  const std::vector<at::Tensor>& projections, const at::Tensor& w_out,
                                  const at::Tensor& b_out, const at::Tensor& h, const std::optional<at::Tensor>& c,
                                  const at::Tensor& logits) {
  constexpr bool kLstm = Cell::kProjGates == 4;
  check_float32(embedding, "embedding", 2);
  check_float32(h, "h", 3);
  check_float32(logits, "logits", 2);
  check_float32(b_out, "b_out", 1);
  const int64_t L = h.size(0), B = h.size(1), P = h.size(2), E = embedding.size(1), V = logits.size(1);
  const int64_t G = Cell::kProjGates;
  TORCH_CHECK(L >= 1 && static_cast<int64_t>(weights.size()) == L && static_cast<int64_t>(biases.size()) == L,
              "weights, biases: expected one per layer (h has ", L, " layers), got ", weights.size(), " and ",
              biases.size());
  TORCH_CHECK(projections.empty() || (kLstm && static_cast<int64_t>(projections.size()) == L),
              "projections: expected none or one per layer (LSTM only), got ", projections.size());
  TORCH_CHECK(kLstm ? b_hn.empty() : static_cast<int64_t>(b_hn.size()) == L,
              "b_hn: expected one per layer for a GRU, none for an LSTM, got ", b_hn.size());
  check_float32(biases[0], "biases", 1);
  const int64_t H = biases[0].size(0) / G;
  TORCH_CHECK(biases[0].size(0) == G * H && (!projections.empty() || H == P), "biases: expected ", G,
              " x hidden_size values per layer (hidden_size = ", P, ", h's columns, without a projection), got ",
              biases[0].size(0));
  const at::ScalarType wtype = weights[0].scalar_type();
  TORCH_CHECK(wtype == at::kFloat || wtype == at::kBFloat16, "weights: expected float32 or bfloat16, got ", wtype);
  const auto check_weight = [&](const at::Tensor& t, const char* name, int64_t rows, int64_t cols) {
    TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == wtype && t.is_contiguous() && t.dim() == 1 &&
                    t.size(0) == padded_rows(rows) * cols,
                name, ": expected the panels (pack_panels) of a (", rows, ", ", cols, ") ", wtype,
                " matrix, ", padded_rows(rows) * cols, " values, got ", t.toString(), " of shape ", t.sizes());
  };
  for (int64_t l = 0; l < L; ++l) {
    check_weight(weights[l], "weights", G * H, (l == 0 ? E : P) + P);
    check_float32(biases[l], "biases", 1);
    TORCH_CHECK(biases[l].size(0) == G * H, "biases: expected ", G * H, " per layer, got ", biases[l].size(0));
    if (!b_hn.empty()) {
      check_float32(b_hn[l], "b_hn", 1);
      TORCH_CHECK(b_hn[l].size(0) == H, "b_hn: expected ", H, " per layer, got ", b_hn[l].size(0));
    }
    if (!projections.empty()) check_weight(projections[l], "projections", P, H);
  }
  check_weight(w_out, "w_out", V, P);
  TORCH_CHECK(b_out.size(0) == V, "b_out: expected ", V, " values (logits has ", V, " columns), got ", b_out.size(0));
  TORCH_CHECK(embedding.size(0) >= V, "embedding: expected at least ", V, " rows (one per token), got ",
              embedding.size(0));
  TORCH_CHECK(logits.size(0) == B, "logits: expected ", B, " rows (h's batch), got ", logits.size(0));
  TORCH_CHECK(kLstm == c.has_value(), "c: expected a cell state for an LSTM, none for a GRU");
  if (c) {
    check_float32(*c, "c", 3);
    TORCH_CHECK(c->size(0) == L && c->size(1) == B && c->size(2) == H, "c: expected shape (", L, ", ", B, ", ", H,
                "), got ", c->sizes());
  }
  return {L, B, E, H, P, V, G};
}

template <class Cell, typename W>
void generate_steps(const GenerationShapes& z, const at::Tensor& embedding, const std::vector<at::Tensor>& weights,
                    const std::vector<at::Tensor>& biases, const std::vector<at::Tensor>& b_hn,
                    const std::vector<at::Tensor>& projections, const at::Tensor& w_out, const at::Tensor& b_out,
                    const at::Tensor& h, const std::optional<at::Tensor>& c, const at::Tensor& logits,
                    int64_t steps, const DrawSettings& settings, at::CPUGeneratorImpl* gen, int64_t* ids) {
  const int64_t L = z.L, B = z.B, H = z.H, P = z.P, V = z.V, GH = z.G * z.H;
  const bool proj = !projections.empty();
  std::vector<float> pre(B * GH), hw(B * GH), gates(4 * H), r(proj ? B * H : 0);
  std::vector<const float*> x_rows(B), h_rows(B), r_rows(B);
  std::vector<double> u(B);
  DrawScratch scratch(V);
  float* h_all = h.data_ptr<float>();
  float* c_all = c ? c->data_ptr<float>() : nullptr;
  float* z_all = logits.data_ptr<float>();
  const float* emb = embedding.data_ptr<float>();
  const float* bo = b_out.data_ptr<float>();
  for (int64_t b = 0; b < B; ++b) r_rows[b] = r.data() + b * H;
  for (int64_t t = 0; t < steps; ++t) {
    if (settings.temperature > 0) uniforms(gen, u);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t id = draw_token(z_all + b * V, V, settings, u[b], scratch);
      ids[b * steps + t] = id;
      x_rows[b] = emb + id * z.E;
    }
    for (int64_t l = 0; l < L; ++l) {
      float* hl = h_all + l * B * P;  // (B, P): this layer's h_{t-1}, overwritten by h_t
      for (int64_t b = 0; b < B; ++b) h_rows[b] = hl + b * P;
      const int64_t I = l == 0 ? z.E : P;
      gemv(weights_of<W>(weights[l]), GH, I, P, x_rows, h_rows, pre.data(), hw.data(), GH);
      float* out = proj ? r.data() : hl;  // the cell's h (LSTM with a projection: r = o * tanh(c))
      const float* bias = biases[l].data_ptr<float>();
      const float* bn = b_hn.empty() ? nullptr : b_hn[l].data_ptr<float>();
      for (int64_t b = 0; b < B; ++b) {
        const FwdRow<float, float> row{pre.data() + b * GH, hw.data() + b * GH, bias, bn, gates.data(),
                                       hl + b * P, c_all ? c_all + (l * B + b) * H : nullptr,
                                       out + b * H, out + b * H};
#pragma omp simd
        for (int64_t j = 0; j < H; ++j) Cell::template forward<true>(row, H, j);
      }
      if (proj) gemv(weights_of<W>(projections[l]), P, H, 0, r_rows, r_rows, hl, nullptr, P);
      for (int64_t b = 0; b < B; ++b) x_rows[b] = hl + b * P;
    }
    gemv(weights_of<W>(w_out), V, P, 0, x_rows, x_rows, z_all, nullptr, V);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t j = 0; j < V; ++j) z_all[b * V + j] += bo[j];
    }
  }
}

// `steps` tokens per sequence: each drawn from `logits`, then fed to the network, whose
// next logits the following draw reads. Returns the ids (B, steps) int64; h, c and logits
// are left as after the last token was fed.
template <class Cell>
at::Tensor generate(const at::Tensor& embedding, const std::vector<at::Tensor>& weights,
                    const std::vector<at::Tensor>& biases, const std::vector<at::Tensor>& b_hn,
                    const std::vector<at::Tensor>& projections, const at::Tensor& w_out, const at::Tensor& b_out,
                    const at::Tensor& h, const std::optional<at::Tensor>& c, const at::Tensor& logits, int64_t steps,
                    double temperature, int64_t top_k, double top_p, std::optional<at::Generator> generator) {
  const GenerationShapes z =
      check_generation<Cell>(embedding, weights, biases, b_hn, projections, w_out, b_out, h, c, logits);
  const DrawSettings settings = check_draw_settings(temperature, top_k, top_p);
  TORCH_CHECK(steps >= 0, "steps: expected an int >= 0, got ", steps);
  at::Tensor ids = at::empty({z.B, steps}, logits.options().dtype(at::kLong));
  at::CPUGeneratorImpl* gen = cpu_generator(generator);
  const auto run = [&]<typename W>() {
    generate_steps<Cell, W>(z, embedding, weights, biases, b_hn, projections, w_out, b_out, h, c, logits, steps,
                            settings, gen, ids.data_ptr<int64_t>());
  };
  if (weights[0].scalar_type() == at::kBFloat16) {
    run.template operator()<c10::BFloat16>();
  } else {
    run.template operator()<float>();
  }
  return ids;
}

}  // namespace lrnn
