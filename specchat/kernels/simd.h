// Eight floats at a time for the layer loop (lean_layers.cpp): AVX2 where the module is built with it,
// else plain C++ that takes the same steps lane by lane (IEEE adds, multiplies, divides and floors
// round alike everywhere), so the layer loop gives the same bits on every CPU.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace simd {

constexpr int64_t LANES = 8;

#if defined(__AVX2__)
struct F8 {
  __m256 v;
};
inline F8 load(const float* p) { return {_mm256_loadu_ps(p)}; }
// Eight bfloat16 (the top halves of float32s) as float32, exactly.
inline F8 load_bf16(const uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(wide, 16))};
}
inline void store(float* p, F8 a) { _mm256_storeu_ps(p, a.v); }
inline F8 splat(float x) { return {_mm256_set1_ps(x)}; }
inline F8 operator+(F8 a, F8 b) { return {_mm256_add_ps(a.v, b.v)}; }
inline F8 operator-(F8 a, F8 b) { return {_mm256_sub_ps(a.v, b.v)}; }
inline F8 operator*(F8 a, F8 b) { return {_mm256_mul_ps(a.v, b.v)}; }
inline F8 operator/(F8 a, F8 b) { return {_mm256_div_ps(a.v, b.v)}; }
inline F8 fma(F8 a, F8 b, F8 c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }  // a·b + c, rounded once
inline F8 lesser(F8 a, F8 b) { return {_mm256_min_ps(a.v, b.v)}; }   // a < b ? a : b
inline F8 greater(F8 a, F8 b) { return {_mm256_max_ps(a.v, b.v)}; }  // a > b ? a : b
inline F8 keep_where_at_least(F8 a, F8 b) { return {_mm256_and_ps(_mm256_cmp_ps(a.v, b.v, _CMP_GE_OQ), a.v)}; }  // a >= b ? a : 0
inline F8 select_less(F8 a, F8 b, F8 x, F8 y) { return {_mm256_blendv_ps(y.v, x.v, _mm256_cmp_ps(a.v, b.v, _CMP_LT_OQ))}; }  // a < b ? x : y
inline F8 floor(F8 a) { return {_mm256_floor_ps(a.v)}; }
// 2^n per lane, n a whole number in float32's exponent range.
inline F8 power_of_two(F8 n) {
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n.v), _mm256_set1_epi32(127)), 23);
  return {_mm256_castsi256_ps(bits)};
}
// The lanes' sum in a fixed order: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)).
inline float lane_sum(F8 a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}
#else
struct F8 {
  float v[LANES];
};
template <typename Op>
inline F8 each(F8 a, F8 b, Op op) {
  F8 out;
  for (int i = 0; i < LANES; ++i) out.v[i] = op(a.v[i], b.v[i]);
  return out;
}
inline F8 load(const float* p) {
  F8 out;
  std::memcpy(out.v, p, sizeof out.v);
  return out;
}
inline F8 load_bf16(const uint16_t* p) {
  F8 out;
  for (int i = 0; i < LANES; ++i) {
    const uint32_t bits = static_cast<uint32_t>(p[i]) << 16;
    std::memcpy(&out.v[i], &bits, sizeof bits);
  }
  return out;
}
inline void store(float* p, F8 a) { std::memcpy(p, a.v, sizeof a.v); }
inline F8 splat(float x) { return {{x, x, x, x, x, x, x, x}}; }
inline F8 operator+(F8 a, F8 b) { return each(a, b, [](float x, float y) { return x + y; }); }
inline F8 operator-(F8 a, F8 b) { return each(a, b, [](float x, float y) { return x - y; }); }
inline F8 operator*(F8 a, F8 b) { return each(a, b, [](float x, float y) { return x * y; }); }
inline F8 operator/(F8 a, F8 b) { return each(a, b, [](float x, float y) { return x / y; }); }
inline F8 fma(F8 a, F8 b, F8 c) {
  F8 out;
  for (int i = 0; i < LANES; ++i) out.v[i] = std::fma(a.v[i], b.v[i], c.v[i]);
  return out;
}
inline F8 lesser(F8 a, F8 b) { return each(a, b, [](float x, float y) { return x < y ? x : y; }); }
inline F8 greater(F8 a, F8 b) { return each(a, b, [](float x, float y) { return x > y ? x : y; }); }
inline F8 keep_where_at_least(F8 a, F8 b) { return each(a, b, [](float x, float y) { return x >= y ? x : 0.0f; }); }
inline F8 select_less(F8 a, F8 b, F8 x, F8 y) {
  F8 out;
  for (int i = 0; i < LANES; ++i) out.v[i] = a.v[i] < b.v[i] ? x.v[i] : y.v[i];
  return out;
}
inline F8 floor(F8 a) { return each(a, a, [](float x, float) { return std::floor(x); }); }
inline F8 power_of_two(F8 n) {
  return each(n, n, [](float x, float) {
    const int32_t bits = (static_cast<int32_t>(x) + 127) << 23;
    float out;
    std::memcpy(&out, &bits, sizeof out);
    return out;
  });
}
inline float lane_sum(F8 a) {
  const float* l = a.v;
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}
#endif

// A float16's value as float32, exactly (every float16 is a float32).
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu;
  uint32_t bits;
  if (exponent == 0) {  // zero or subnormal: mantissa · 2^-24, exact in float32
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    std::memcpy(&bits, &magnitude, sizeof bits);
    bits |= sign;
  } else if (exponent == 31) {  // infinity or NaN
    bits = sign | 0x7F800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  }
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

// Eight float16 as float32, exactly: F16C where the module is built with it, else lane by lane.
inline F8 load_half(const uint16_t* p) {
#if defined(__AVX2__) && defined(__F16C__)
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))};
#else
  float lanes[LANES];
  for (int i = 0; i < LANES; ++i) lanes[i] = half_to_float(p[i]);
  return load(lanes);
#endif
}

// e^x per lane (Cephes' expf: a degree-5 polynomial on x - n ln 2, times 2^n), relative error about
// 2e-7; 0 below about -87.7, and x is capped at 88 (e^88 is near float32's largest). Each lane's result
// depends on that lane alone.
inline F8 exp(F8 x) {
  x = lesser(greater(x, splat(-88.0f)), splat(88.0f));
  const F8 n = floor(x * splat(1.44269504088896341f) + splat(0.5f));
  x = x - n * splat(0.693359375f);
  x = x - n * splat(-2.12194440e-4f);
  const F8 square = x * x;
  F8 y = splat(1.9875691500e-4f);
  for (const float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f})
    y = y * x + splat(c);
  y = y * square + x + splat(1.0f);
  return y * power_of_two(n);
}

// tanh per lane (Cephes' tanhf): an odd degree-9 polynomial below |x| = 0.625, else 1 − 2 / (e^2x + 1) on this
// file's exp (±1 far out); relative error about 3e-7. Only the operations above, so every path gives the same bits.
inline F8 tanh(F8 x) {
  const F8 square = x * x;
  F8 p = splat(-5.70498872745e-3f);
  for (const float c : {2.06390887954e-2f, -5.37397155531e-2f, 1.33314422036e-1f, -3.33332819422e-1f})
    p = p * square + splat(c);
  const F8 small = p * square * x + x;
  const F8 large = splat(1.0f) - splat(2.0f) / (exp(x + x) + splat(1.0f));
  return select_less(square, splat(0.390625f), small, large);  // 0.390625 = 0.625²
}

}  // namespace simd
