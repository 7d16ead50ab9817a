// Bernoulli masks from a counter-based generator: bit j of a mask is a hash of (seed, j),
// so a mask is drawn in one vectorized pass (torch's CPU generator runs one element at a
// time) and is the same for the same seed whatever the thread count. The seed comes from
// torch's generator (kernels/masks.py: draw), so torch.manual_seed reproduces the masks.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdint>

#include "rnn_pool.h"

namespace lrnn {

// A 32-bit integer hash with full avalanche (each input bit flips each output bit with
// probability ~1/2): two xorshift-multiply rounds ("lowbias32" constants).
inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// Mask elements [begin, end): the top 24 bits of mix32(mix32(j ^ lo) ^ hi) below threshold.
// Scalar arguments and a loop of its own, so that it vectorizes (byte stores may alias
// anything a lambda captures by reference, or reads from the stack).
__attribute__((noinline)) inline void fill_mask(uint8_t* out, int64_t begin, int64_t end, uint32_t lo, uint32_t hi,
                                                uint32_t threshold) {
#pragma omp simd
  for (int64_t j = begin; j < end; ++j) {
    out[j] = (mix32(mix32(static_cast<uint32_t>(j) ^ lo) ^ hi) >> 8) < threshold;
  }
}

// A bool tensor of `numel` elements, each true with probability p (to 2^-24), from a seed.
inline at::Tensor random_mask(int64_t seed, int64_t numel, double p) {
  TORCH_CHECK(numel >= 0 && numel < (int64_t(1) << 32), "random_mask: expected 0 <= numel < 2^32, got ", numel);
  TORCH_CHECK(p >= 0 && p <= 1, "random_mask: expected p in [0, 1], got ", p);
  // a pooled block: a fresh one faults its pages in at every call (rnn_pool.h)
  at::Tensor mask = BufferPool::empty({numel}, at::TensorOptions().dtype(at::kBool));
  if (p >= 1) return mask.fill_(true);
  uint8_t* out = reinterpret_cast<uint8_t*>(mask.data_ptr());
  const auto bits = static_cast<uint64_t>(seed);
  const uint32_t lo = static_cast<uint32_t>(bits), hi = static_cast<uint32_t>(bits >> 32);
  const uint32_t threshold = static_cast<uint32_t>(p * 16777216.0);  // p * 2^24
  at::parallel_for(0, numel, int64_t(1) << 16,
                   [=](int64_t begin, int64_t end) { fill_mask(out, begin, end, lo, hi, threshold); });
  return mask;
}

}  // namespace lrnn
