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
// Written for few vector instructions (the LSTM forward's five activations per element
// are bound by their count): the clamps in the form of min/max instructions, and n
// rounded by adding 1.5 * 2^23, which leaves n in t's low mantissa bits, so that 2^n is
// t's bits shifted, with no round or float-to-int conversion. That is 5-6 instructions per
// exp fewer than floor(x / ln 2 + 0.5) and a blend per clamp, at the same accuracy.
struct ExpParts {
  float q, scale;  // scale = 2^n
};

RNN_HD ExpParts exp_parts(float x) {
  // NaN passes both clamps (the comparisons are false) and the polynomial: exp(NaN) = NaN.
  float xc = 88.0f < x ? 88.0f : x;
  xc = -87.0f > xc ? -87.0f : xc;
  const float t = xc * 1.44269504088896341f + 12582912.0f;  // 12582912 = 1.5 * 2^23
  const float n = t - 12582912.0f;
  float r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  int32_t t_bits;  // 0x4B400000 + n: shifted left by 23, the 0x4B400000 drops out
  std::memcpy(&t_bits, &t, sizeof(t_bits));
  const int32_t bits = static_cast<int32_t>(static_cast<uint32_t>(t_bits + 127) << 23);
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
// relative accuracy at the same cost. x's sign is copied onto the result (tanh(-0) = -0,
// NaN stays NaN).
RNN_HD float tanh_act(float x) {
  float ax = std::fabs(x);
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
