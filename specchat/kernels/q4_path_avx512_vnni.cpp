// The w4a8 product with AVX-512 VNNI: a tile's 16 output rows are the 16 int32 lanes of one register,
// and `vpdpbusd` adds four unsigned-level × signed-activation products into each lane in one
// instruction. A group's levels are unpacked once for all the rows of a job (layout: q4_tiles.h).
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#include <cstdint>

#include "q4_tiles.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma"))), apply_to = function)
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,fma")
#endif

namespace q4 {
namespace {

constexpr int MAX_ROWS = 8;  // activation rows per pass over a tile's weights (their sums stay in registers)

// One group's 8 level vectors (vector q: L[j][4q..4q+3] in lane j).
template <int BITS>
inline void unpack(const uint8_t* qs, __m512i* v) {
  if constexpr (BITS == 7) {
    for (int q = 0; q < 8; ++q) v[q] = _mm512_loadu_si512(qs + q * 64);
  } else {
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int c = 0; c < 4; ++c) {
      const __m512i packed = _mm512_loadu_si512(qs + c * 64);
      v[c] = _mm512_and_si512(packed, low);
      v[c + 4] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low);
    }
    if constexpr (BITS == 6) {  // top 2 bits of vector 4e+s at bits 2s..2s+1 → bits 4-5 of its byte
      const __m512i bits_4_5 = _mm512_set1_epi8(0x30);
      for (int e = 0; e < 2; ++e) {
        const __m512i top = _mm512_loadu_si512(qs + 256 + e * 64);
        const __m512i shifted[4] = {_mm512_slli_epi16(top, 4), _mm512_slli_epi16(top, 2), top, _mm512_srli_epi16(top, 2)};
        for (int s = 0; s < 4; ++s) v[4 * e + s] = _mm512_or_si512(v[4 * e + s], _mm512_and_si512(shifted[s], bits_4_5));
      }
    }
  }
}

// Four activation levels in every lane (or two int16 group sums).
inline __m512i broadcast4(const void* bytes) {
  int32_t quad;
  __builtin_memcpy(&quad, bytes, 4);
  return _mm512_set1_epi32(quad);
}

inline __m512i widen(const uint8_t* bytes) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes)));
}

// Group g's Σ L·x for R rows, then times the group's scales into dot. With one or two rows the
// products go to two accumulators (half the chain of dependent `vpdpbusd`s).
template <int R>
inline void group_dots(const __m512i* v, __m512i scales, const int8_t* const* levels, __m512i* dot) {
  for (int r = 0; r < R; ++r) {
    __m512i even = _mm512_setzero_si512(), odd = _mm512_setzero_si512();
    for (int q = 0; q < 8; q += 2) {
      even = _mm512_dpbusd_epi32(even, v[q], broadcast4(levels[r] + 4 * q));
      if constexpr (R <= 2) odd = _mm512_dpbusd_epi32(odd, v[q + 1], broadcast4(levels[r] + 4 * q + 4));
      else even = _mm512_dpbusd_epi32(even, v[q + 1], broadcast4(levels[r] + 4 * q + 4));
    }
    if constexpr (R <= 2) even = _mm512_add_epi32(even, odd);
    dot[r] = _mm512_add_epi32(dot[r], _mm512_mullo_epi32(even, scales));
  }
}

// Block b's dot and offset sums (q4_tiles.h) for R activation rows from `first`, asking for the
// weights PREFETCH bytes ahead: the hardware's prefetcher alone leaves a verification's rows waiting
// on memory (5 rows of a target-sized stack: 61 ms with it alone, 44 with this; one row: 41, 39).
template <int R, int BITS>
inline void block_sums(const Tiles& w, const Rows& x, int64_t tile, int64_t first, int64_t b, __m512i* dot, __m512i* offset) {
  constexpr int64_t BYTES = TILE_ROWS * group_bytes(BITS), PREFETCH = 4096;
  const int64_t per_block = w.groups / w.blocks;
  for (int r = 0; r < R; ++r) dot[r] = offset[r] = _mm512_setzero_si512();
  for (int64_t g = b * per_block; g < (b + 1) * per_block; ++g) {
    const int64_t at = tile * w.groups + g;
    const uint8_t* qs = w.qs + at * BYTES;
    for (int64_t line = 0; line < BYTES; line += 64) _mm_prefetch(reinterpret_cast<const char*>(qs + PREFETCH + line), _MM_HINT_T0);
    __m512i v[8];
    unpack<BITS>(qs, v);
    const int8_t* levels[R];
    for (int r = 0; r < R; ++r) levels[r] = x.levels + (first + r) * x.width + g * GROUP;
    group_dots<R>(v, widen(w.sc + at * TILE_ROWS), levels, dot);
    if (g % 2 == 1) {  // the pair's offsets: m as int16 pairs times the two group sums
      const __m512i mins = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.m + (at - 1) * TILE_ROWS)));
      for (int r = 0; r < R; ++r) offset[r] = _mm512_dpwssd_epi32(offset[r], mins, broadcast4(x.sums + (first + r) * w.groups + g - 1));
    }
  }
}

template <int R, int BITS>
void rows_of_tile(const Tiles& w, const Rows& x, const Job& job, int64_t first) {
  float* out[R];
  for (int r = 0; r < R; ++r) {
    out[r] = job.out + (first + r) * job.stride + job.tile * TILE_ROWS;
    _mm512_storeu_ps(out[r], _mm512_setzero_ps());
  }
  for (int64_t b = 0; b < w.blocks; ++b) {
    __m512i dot[R], offset[R];
    block_sums<R, BITS>(w, x, job.tile, first, b, dot, offset);
    const __m512 d = _mm512_loadu_ps(w.d + (job.tile * w.blocks + b) * TILE_ROWS);
    const __m512 dmin = _mm512_loadu_ps(w.dmin + (job.tile * w.blocks + b) * TILE_ROWS);
    for (int r = 0; r < R; ++r) {
      const __m512 scale = _mm512_set1_ps(x.scales[(first + r) * w.blocks + b]);
      __m512 total = _mm512_loadu_ps(out[r]);
      total = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r]), _mm512_mul_ps(d, scale), total);
      total = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(offset[r]), _mm512_mul_ps(dmin, scale), total);
      _mm512_storeu_ps(out[r], total);
    }
  }
}

template <int BITS>
void tile_rows(const Tiles& w, const Rows& x, const Job& job) {
  in_chunks<MAX_ROWS>(job, [&](auto rows, int64_t first) { rows_of_tile<decltype(rows)::value, BITS>(w, x, job, first); });
}

}  // namespace

void tile_avx512_vnni(const Tiles& w, const Rows& x, const Job& job) {
  switch (w.bits) {
    case 4: return tile_rows<4>(w, x, job);
    case 6: return tile_rows<6>(w, x, job);
    default: return tile_rows<7>(w, x, job);
  }
}

}  // namespace q4

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
