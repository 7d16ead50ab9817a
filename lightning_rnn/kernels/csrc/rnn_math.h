// Activation functions for the fused recurrent kernels, usable on host and device.
//
// float: a Cephes-style exp with a degree-6 polynomial (~2 ulp), written with plain
// arithmetic and a bit cast so that the CPU row loops auto-vectorize (AVX2/FMA under
// -O3 -march=native); sigmoid and tanh are built on it (tanh with a polynomial near 0).
// NaN propagates.
// double: the exact libm functions (the float64 path is for parity, not speed).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define RNN_HD __host__ __device__ __forceinline__
#else
#define RNN_HD inline __attribute__((always_inline))
#endif

namespace lrnn {

#if !defined(__CUDA_ARCH__)
// exp(x) for x in float, vectorizable; clamps to [-87, 88] (results stay finite).
RNN_HD float exp_approx(float x) {
  float xc = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  float n = std::floor(xc * 1.44269504088896341f + 0.5f);
  float r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// NaN needs no test: it passes the clamps and the polynomial, so exp_approx(NaN) is NaN.
RNN_HD float sigmoid(float x) { return 1.0f / (1.0f + exp_approx(-x)); }

// |x| >= 0.625: (1 - e) / (1 + e) with e = exp(-2|x|). Below, 1 - e cancels (an absolute
// error of ~6e-8: 3e-4 relative at |x| = 1e-4, and 0 for |x| < 3e-8), so there Cephes'
// odd polynomial x + x^3 P(x^2) (~2 ulp) is used; both are computed and one is selected,
// so the row loops stay vectorized. NaN fails the |x| < 0.625 test and takes the first.
RNN_HD float tanh_act(float x) {
  float ax = x < 0.0f ? -x : x;
  float e = exp_approx(-2.0f * ax);
  float t = (1.0f - e) / (1.0f + e);
  t = x < 0.0f ? -t : t;
  float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  p = p * z * x + x;
  return ax < 0.625f ? p : t;
}
#else
RNN_HD float sigmoid(float x) { return 1.0f / (1.0f + ::expf(-x)); }
RNN_HD float tanh_act(float x) { return ::tanhf(x); }
#endif

RNN_HD double sigmoid(double x) { return 1.0 / (1.0 + ::exp(-x)); }
RNN_HD double tanh_act(double x) { return ::tanh(x); }

// Derivatives expressed through the activation's output y.
template <typename T>
RNN_HD T sigmoid_grad(T y) { return y * (T(1) - y); }
template <typename T>
RNN_HD T tanh_grad(T y) { return T(1) - y * y; }

}  // namespace lrnn
