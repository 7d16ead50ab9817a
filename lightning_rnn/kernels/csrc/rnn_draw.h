// Drawing a token from a row of logits, for the generation loop (rnn_generate.h): the
// temperature, top-k and top-p filters, then a categorical draw with a uniform number
// from a torch.Generator (its CPU implementation's random64, locked while drawing), so
// that a seed reproduces the draws.
#pragma once

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace lrnn {

struct DrawSettings {
  double temperature;  // 0: the most likely token
  int64_t top_k;       // 0: no top-k restriction
  double top_p;        // 1: no nucleus restriction
};

// Scratch of V doubles per draw, reused.
struct DrawScratch {
  std::vector<double> p, sorted;
  explicit DrawScratch(int64_t V) : p(V), sorted(V) {}
};

// One token from the logits z (V). Temperature 0: the first most likely token. Otherwise
// softmax((z - max z) / T) restricted to the top_k largest (ties with the k-th kept) and
// then to the nucleus: the most likely tokens, each kept when the tokens more likely
// than it hold less than top_p of the probability (ties kept or dropped together), drawn
// by inverting the cumulative sum with u in [0, 1). The same filters as the Python path
// (modules/sampling.py: sample_next), in double rather than float32.
inline int64_t draw_token(const float* z, int64_t V, const DrawSettings& s, double u, DrawScratch& scratch) {
  int64_t best = 0;
  float m = z[0];
  for (int64_t j = 0; j < V; ++j) {
    TORCH_CHECK(!std::isnan(z[j]), "logits: the model's output holds NaN (its weights are not finite?)");
    if (z[j] > m) m = z[j], best = j;
  }
  TORCH_CHECK(std::isfinite(m), "logits: the model's largest logit is ", m, ", expected a finite number");
  if (s.temperature == 0) return best;
  std::vector<double>& p = scratch.p;
  for (int64_t j = 0; j < V; ++j) p[j] = (double(z[j]) - double(m)) / s.temperature;  // <= 0
  if (s.top_k > 0 && s.top_k < V) {
    std::vector<double>& sorted = scratch.sorted;
    std::copy(p.begin(), p.begin() + V, sorted.begin());
    std::nth_element(sorted.begin(), sorted.begin() + (s.top_k - 1), sorted.begin() + V, std::greater<double>());
    const double kth = sorted[s.top_k - 1];
    for (int64_t j = 0; j < V; ++j) {
      if (p[j] < kth) p[j] = -std::numeric_limits<double>::infinity();
    }
  }
  double total = 0;
  for (int64_t j = 0; j < V; ++j) total += (p[j] = std::exp(p[j]));  // the largest is exp(0) = 1
  if (s.top_p < 1) {
    std::vector<double>& sorted = scratch.sorted;
    std::copy(p.begin(), p.begin() + V, sorted.begin());
    std::sort(sorted.begin(), sorted.begin() + V, std::greater<double>());
    double above = 0, smallest_kept = sorted[0];
    for (int64_t i = 0; i < V && above < s.top_p * total; ++i) {
      smallest_kept = sorted[i];
      above += sorted[i];
    }
    total = 0;
    for (int64_t j = 0; j < V; ++j) {
      if (p[j] < smallest_kept) p[j] = 0;
      total += p[j];
    }
  }
  // the same sums in the same order as total: the walk reaches total, which exceeds u * total
  const double target = u * total;
  double cumulative = 0;
  int64_t last = best;
  for (int64_t j = 0; j < V; ++j) {
    if (p[j] <= 0) continue;
    cumulative += p[j];
    last = j;
    if (cumulative > target) return j;
  }
  return last;  // u * total rounded up to total
}

// u in [0, 1) with 53 random bits, one per row, from the generator (locked while drawing).
inline void uniforms(at::CPUGeneratorImpl* gen, std::vector<double>& u) {
  std::lock_guard<std::mutex> lock(gen->mutex_);
  for (double& v : u) v = static_cast<double>(gen->random64() >> 11) * (1.0 / 9007199254740992.0);  // 2^-53
}

inline at::CPUGeneratorImpl* cpu_generator(const std::optional<at::Generator>& generator) {
  return at::get_generator_or_default<at::CPUGeneratorImpl>(generator, at::detail::getDefaultCPUGenerator());
}

inline DrawSettings check_draw_settings(double temperature, int64_t top_k, double top_p) {
  TORCH_CHECK(std::isfinite(temperature) && temperature >= 0, "temperature: expected a finite number >= 0, got ",
              temperature);
  TORCH_CHECK(top_k >= 0, "top_k: expected an int >= 0 (0: all tokens), got ", top_k);
  TORCH_CHECK(top_p > 0 && top_p <= 1, "top_p: expected a number in (0, 1], got ", top_p);
  return {temperature, top_k, top_p};
}

inline void check_float32(const at::Tensor& t, const char* name, int64_t dim) {
  TORCH_CHECK(t.defined() && t.device().is_cpu() && t.scalar_type() == at::kFloat && t.dim() == dim &&
                  t.is_contiguous(),
              name, ": expected a contiguous ", dim, "-D float32 CPU tensor, got ",
              t.defined() ? t.toString() + " of shape " + c10::str(t.sizes()) : std::string("None"));
}

// ids (B,) int64 drawn from logits (B, V) float32: the draw of the generation loop alone.
inline at::Tensor draw_tokens(const at::Tensor& logits, double temperature, int64_t top_k, double top_p,
                              std::optional<at::Generator> generator) {
  check_float32(logits, "logits", 2);
  const DrawSettings settings = check_draw_settings(temperature, top_k, top_p);
  const int64_t B = logits.size(0), V = logits.size(1);
  TORCH_CHECK(V > 0, "logits: expected at least one column, got shape ", logits.sizes());
  at::Tensor ids = at::empty({B}, logits.options().dtype(at::kLong));
  std::vector<double> u(B);
  if (temperature > 0) uniforms(cpu_generator(generator), u);
  DrawScratch scratch(V);
  for (int64_t b = 0; b < B; ++b) {
    ids.data_ptr<int64_t>()[b] = draw_token(logits.data_ptr<float>() + b * V, V, settings, u[b], scratch);
  }
  return ids;
}

}  // namespace lrnn
