// The time-step schedule of one direction (packed, time-major; see kernels/steps.py):
// step t owns rows [offset[t], offset[t] + size[t]) of the packed data, sizes are
// non-increasing, and reverse=true visits the steps T-1..0.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

namespace lrnn {

struct Schedule {
  std::vector<int64_t> sizes, offsets;
  bool reverse = false;
  int64_t T = 0, B = 0, N = 0;

  Schedule(const at::Tensor& batch_sizes, bool reverse_) : reverse(reverse_) {
    TORCH_CHECK(batch_sizes.device().is_cpu() && batch_sizes.dim() == 1 &&
                    batch_sizes.scalar_type() == at::kLong && batch_sizes.numel() > 0,
                "batch_sizes: expected a non-empty 1-D int64 CPU tensor, got ",
                batch_sizes.scalar_type(), " of shape ", batch_sizes.sizes(), " on ", batch_sizes.device());
    auto bs = batch_sizes.contiguous();
    const int64_t* p = bs.data_ptr<int64_t>();
    T = bs.numel();
    sizes.assign(p, p + T);
    offsets.resize(T);
    B = sizes[0];
    for (int64_t t = 0; t < T; ++t) {
      TORCH_CHECK(sizes[t] >= 1 && sizes[t] <= (t ? sizes[t - 1] : B),
                  "batch_sizes: expected positive, non-increasing sizes, got ", batch_sizes);
      offsets[t] = N;
      N += sizes[t];
    }
  }

  // The t of the k-th step the forward recurrence visits.
  int64_t step(int64_t k) const { return reverse ? T - 1 - k : k; }
  // The step the forward recurrence visited before t (-1 if none).
  int64_t prev(int64_t t) const { return reverse ? (t + 1 < T ? t + 1 : -1) : t - 1; }
};

}  // namespace lrnn
