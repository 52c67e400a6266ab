// The activations' int8 levels with AVX2, which every x86 path uses (the portable path's bits:
// q4_path_portable.cpp). A file of its own: every build compiles it, whichever product paths it holds.
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#include <cstdint>

#include "q4_tiles.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c")
#endif

namespace {

// The largest |x| of a block (NaNs passed over, as std::fmax does: `max` keeps its second operand when the
// first is NaN; a max is exact in any order) and whether all of it is finite.
float block_amax(const float* in, int64_t count, bool& finite) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 largest = _mm256_set1_ps(3.40282347e38f);
  __m256 amax = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
  for (int64_t i = 0; i < count; i += 8) {
    const __m256 a = _mm256_and_ps(_mm256_loadu_ps(in + i), magnitude);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, largest, _CMP_NLE_UQ));  // an infinity or a NaN
    amax = _mm256_max_ps(a, amax);
  }
  finite = finite && _mm256_movemask_ps(bad) == 0;
  __m128 half = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  half = _mm_max_ps(half, _mm_movehl_ps(half, half));
  return _mm_cvtss_f32(_mm_max_ss(half, _mm_movehdup_ps(half)));
}

// The sum of an int32 vector's lanes.
int32_t lane_sum(__m256i sum) {
  __m128i folded = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
  folded = _mm_add_epi32(folded, _mm_shuffle_epi32(folded, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(folded, _mm_shuffle_epi32(folded, 0xB1)));
}

// 32 values times `inverse`, rounded to the nearest even integer as std::nearbyint does, into int8 levels;
// the sums of their two halves of 16 into half_sums.
void quantize_group(const float* in, float inverse, int8_t* levels, int16_t* half_sums) {
  const __m256 by = _mm256_set1_ps(inverse);
  __m256i q[4];
  for (int k = 0; k < 4; ++k)
    q[k] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(in + 8 * k), by),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(levels),
                      _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  half_sums[0] = static_cast<int16_t>(lane_sum(_mm256_add_epi32(q[0], q[1])));
  half_sums[1] = static_cast<int16_t>(lane_sum(_mm256_add_epi32(q[2], q[3])));
}

}  // namespace

bool q4::quantize_row_avx2(const float* x, int64_t width, int64_t block, const RowOut& out) {
  bool finite = true;
  for (int64_t b = 0; b < width / block; ++b) {
    const float amax = block_amax(x + b * block, block, finite);
    const float scale = finite ? amax / 127.f : 0.f;
    const float inverse = scale > 0.f ? 1.f / scale : 0.f;
    out.scales[b] = scale;
    for (int64_t g = b * block / GROUP; g < (b + 1) * block / GROUP; ++g) {
      quantize_group(x + g * GROUP, inverse, out.levels + g * GROUP, out.half_sums + 2 * g);
      out.sums[g] = static_cast<int16_t>(out.half_sums[2 * g] + out.half_sums[2 * g + 1]);
    }
  }
  return finite;
}

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
