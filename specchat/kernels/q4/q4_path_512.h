// What the 512-bit paths (q4_path_avx512_vnni.cpp, q4_path_amx.cpp) share: a group's levels unpacked
// into 8 vectors, one output row per int32 lane (layout: q4_tiles.h), a block's offset sums, and the
// float steps that add a block into a row's outputs. Each path file includes it under its own
// instruction-set target.
#pragma once
#include <immintrin.h>
#include <cstdint>

#include "q4_tiles.h"

namespace q4 {
namespace {

// One group's 8 level vectors (vector q: L[j][4q..4q+3] in lane j).
template <int BITS>
inline void unpack(const uint8_t* qs, __m512i* v) {
  if constexpr (BITS == 8) {
    for (int q = 0; q < 8; ++q) v[q] = _mm512_loadu_si512(qs + q * 64);
  } else {
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int c = 0; c < 4; ++c) {
      const __m512i packed = _mm512_loadu_si512(qs + c * 64);
      v[c] = _mm512_and_si512(packed, low);
      v[c + 4] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low);
    }
    if constexpr (BITS == TABLE) {  // each index's level, the table in every 128-bit lane
      const __m512i table = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(IQ4_LEVELS)));
      for (int q = 0; q < 8; ++q) v[q] = _mm512_shuffle_epi8(table, v[q]);
    }
    if constexpr (BITS == 6) {  // top 2 bits of vector 4e+s at bits 2s..2s+1 → bits 4-5 of its byte
      const __m512i bits_4_5 = _mm512_set1_epi8(0x30);
      for (int e = 0; e < 2; ++e) {
        const __m512i top = _mm512_loadu_si512(qs + 256 + e * 64);
        const __m512i shifted[4] = {_mm512_slli_epi16(top, 4), _mm512_slli_epi16(top, 2), top, _mm512_srli_epi16(top, 2)};
        for (int s = 0; s < 4; ++s)  // v | (shifted & bits_4_5) in one instruction (0xF8: A | (B & C))
          v[4 * e + s] = _mm512_ternarylogic_epi32(v[4 * e + s], shifted[s], bits_4_5, 0xF8);
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

// 32 bytes as 32 int16 lanes (two a 32-bit lane).
inline __m512i widen16(const uint8_t* bytes) {
  return _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bytes)));
}

// Block b's offset sums (q4_tiles.h) for R activation rows from `first`: m as int16 pairs (signed with halves)
// times each step's pair of activation sums (step_mins, step_sums).
template <int R, bool HALVES>
inline void block_offsets(const Tiles& w, const Rows& x, int64_t tile, int64_t first, int64_t b, __m512i* offset) {
  const int64_t per_block = w.groups / w.blocks;
  for (int r = 0; r < R; ++r) offset[r] = _mm512_setzero_si512();
  for (int64_t g = b * per_block; g < (b + 1) * per_block; g += HALVES ? 1 : 2) {
    const __m256i m = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(step_mins<HALVES>(w, tile, g)));
    const __m512i mins = HALVES ? _mm512_cvtepi8_epi16(m) : _mm512_cvtepu8_epi16(m);
    for (int r = 0; r < R; ++r)
      offset[r] = _mm512_dpwssd_epi32(offset[r], mins, _mm512_set1_epi32(step_sums<HALVES>(w, x, first + r, g)));
  }
}

// A group's scales as int32 lanes, a row each: scales[0] (and, halves, scales[1] for its last 16 inputs).
template <bool HALVES>
inline void group_scales(const Tiles& w, int64_t at, __m512i* scales) {
  if constexpr (HALVES) {
    for (int h = 0; h < 2; ++h)
      scales[h] = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.sc + (2 * at + h) * TILE_ROWS)));
  } else {
    scales[0] = w.unit_scales ? _mm512_set1_epi32(1) : widen(w.sc + at * TILE_ROWS);
  }
}

// out += block b's part for R rows from `first`: out = fma(dot, d·xs, out); out = fma(−offset, dmin·xs, out).
template <int R>
inline void add_block(const Tiles& w, const Rows& x, const Job& job, int64_t b, int64_t first, const __m512i* dot,
                      const __m512i* offset) {
  const int64_t lanes = (job.tile * w.blocks + b) * TILE_ROWS;
  const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.d + lanes)));
  const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.dmin + lanes)));
  for (int r = 0; r < R; ++r) {
    float* out = job.out + (first + r) * job.stride + job.tile * TILE_ROWS;
    const __m512 scale = _mm512_set1_ps(x.scales[(first + r) * w.blocks + b]);
    __m512 total = _mm512_loadu_ps(out);
    total = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r]), _mm512_mul_ps(d, scale), total);
    total = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(offset[r]), _mm512_mul_ps(dmin, scale), total);
    _mm512_storeu_ps(out, total);
  }
}

}  // namespace
}  // namespace q4
