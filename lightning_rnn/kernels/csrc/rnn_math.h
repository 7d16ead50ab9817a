// Activation functions for the fused recurrent kernels, usable on host and device.
//
// float: a Cephes-style exp with a degree-6 polynomial (~2 ulp), written with plain
// arithmetic and a bit cast so that the CPU row loops auto-vectorize (AVX2/FMA under
// -O3 -march=native); sigmoid and tanh are built on it (tanh on its exp(x) - 1 form).
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
// exp(x) = 2^n (1 + q) for x in float, clamped to [-87, 88] (results stay finite): n the
// nearest integer to x / ln 2, q = exp(r) - 1 by a degree-6 polynomial of r = x - n ln 2
// (|r| <= ln 2 / 2). Where n = 0, r is x itself, so q keeps its relative accuracy near 0.
struct ExpParts {
  float q, scale;  // scale = 2^n
};

RNN_HD ExpParts exp_parts(float x) {
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
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return {p * r * r + r, scale};
}

RNN_HD float exp_approx(float x) {
  const ExpParts e = exp_parts(x);
  return (e.q + 1.0f) * e.scale;
}

// exp(x) - 1 without the cancellation of exp_approx(x) - 1 near 0 (there n = 0: it is q).
RNN_HD float expm1_approx(float x) {
  const ExpParts e = exp_parts(x);
  return e.q * e.scale + (e.scale - 1.0f);
}

// NaN needs no test: it passes the clamps and the polynomial, so exp_approx(NaN) is NaN.
RNN_HD float sigmoid(float x) { return 1.0f / (1.0f + exp_approx(-x)); }

// tanh|x| = (1 - e) / (1 + e) with e = exp(-2|x|), as -m / (2 + m) with m = e - 1 from
// expm1_approx: 1 - e computed as a difference cancelled near 0 (an absolute error of
// ~6e-8: 3e-4 relative at |x| = 1e-4, and tanh(x) = 0 below 3e-8), -m keeps float32's
// relative accuracy. The same cost as before; x's sign is copied onto the result
// (tanh(-0) = -0, NaN stays NaN).
RNN_HD float tanh_act(float x) {
  float ax = x < 0.0f ? -x : x;
  float m = expm1_approx(-2.0f * ax);
  return std::copysign(-m / (2.0f + m), x);
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
