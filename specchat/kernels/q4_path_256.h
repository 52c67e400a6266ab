// The w4a8 product on 256-bit vectors, for the AVX2 and AVX-VNNI paths (q4_path_avx2.cpp,
// q4_path_avx_vnni.cpp include it, each under its own instruction-set target). A tile is two halves
// of 8 output rows, one int32 lane each (layout: q4_tiles.h).
//   AVX-VNNI: `vpdpbusd` adds four level × activation products into each lane.
//   AVX2: `maddubs` gives int16 pair sums, added in int16 for as many vectors as cannot overflow
//   (4-bit: 8, 6-bit: 2, 7-bit: 1), then `madd` with the group's scale folds them into int32.
// Both give the exact integer sums every path gives.
#pragma once
#include <immintrin.h>
#include <cstdint>

#include "q4_tiles.h"

namespace q4 {
namespace {

constexpr int MAX_ROWS = 3;  // activation rows per pass over a tile: both halves' sums fit 16 registers (measured best)

// Rows 8h..8h+7 of level vector q of one group.
template <int BITS>
inline __m256i level_vector(const uint8_t* qs, int q, int half) {
  if constexpr (BITS == 7) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + q * 64 + half * 32));
  } else {
    const __m256i low = _mm256_set1_epi8(0x0F);
    const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + (q % 4) * 64 + half * 32));
    __m256i v = _mm256_and_si256(q < 4 ? packed : _mm256_srli_epi16(packed, 4), low);
    if constexpr (BITS == 6) {
      const __m256i top = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 256 + (q / 4) * 64 + half * 32));
      const int s = q % 4;
      const __m256i shifted = s == 0 ? _mm256_slli_epi16(top, 4) : s == 1 ? _mm256_slli_epi16(top, 2)
                              : s == 2 ? top : _mm256_srli_epi16(top, 2);
      v = _mm256_or_si256(v, _mm256_and_si256(shifted, _mm256_set1_epi8(0x30)));
    }
    return v;
  }
}

// Four activation levels in every lane (or two int16 group sums).
inline __m256i broadcast4(const void* bytes) {
  int32_t quad;
  __builtin_memcpy(&quad, bytes, 4);
  return _mm256_set1_epi32(quad);
}

inline __m256i widen(const uint8_t* bytes) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes)));
}

// Group g's Σ sc·L·x for R rows, added to dot (int32 lanes).
template <int R, int BITS, bool VNNI>
inline void group_dots(const uint8_t* qs, __m256i scales, const int8_t* const* levels, int half, __m256i* dot) {
  constexpr int RUN = BITS == 4 ? 8 : BITS == 6 ? 2 : 1;
  const __m256i scale_pairs = _mm256_or_si256(scales, _mm256_slli_epi32(scales, 16));
  __m256i acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_si256();
  for (int q = 0; q < 8; ++q) {
    const __m256i v = level_vector<BITS>(qs, q, half);
    for (int r = 0; r < R; ++r) {
      const __m256i x = broadcast4(levels[r] + 4 * q);
      if constexpr (VNNI) {
        acc[r] = _mm256_dpbusd_avx_epi32(acc[r], v, x);
      } else {
        acc[r] = _mm256_add_epi16(acc[r], _mm256_maddubs_epi16(v, x));
        if ((q + 1) % RUN == 0) {
          dot[r] = _mm256_add_epi32(dot[r], _mm256_madd_epi16(acc[r], scale_pairs));
          acc[r] = _mm256_setzero_si256();
        }
      }
    }
  }
  if constexpr (VNNI)
    for (int r = 0; r < R; ++r) dot[r] = _mm256_add_epi32(dot[r], _mm256_mullo_epi32(acc[r], scales));
}

// Block b's dot and offset sums (q4_tiles.h) for R activation rows from `first`, both halves of the
// tile in one pass (sums [h·R + r]), so each cache line of weights is read once; it asks for the
// weights PREFETCH bytes ahead.
template <int R, int BITS, bool VNNI>
inline void block_sums(const Tiles& w, const Rows& x, int64_t tile, int64_t first, int64_t b, __m256i* dot,
                       __m256i* offset) {
  constexpr int64_t BYTES = TILE_ROWS * group_bytes(BITS), PREFETCH = 4096;
  const int64_t per_block = w.groups / w.blocks;
  for (int i = 0; i < 2 * R; ++i) dot[i] = offset[i] = _mm256_setzero_si256();
  for (int64_t g = b * per_block; g < (b + 1) * per_block; ++g) {
    const int64_t at = tile * w.groups + g;
    const uint8_t* qs = w.qs + at * BYTES;
    for (int64_t line = 0; line < BYTES; line += 64) _mm_prefetch(reinterpret_cast<const char*>(qs + PREFETCH + line), _MM_HINT_T0);
    const int8_t* levels[R];
    for (int r = 0; r < R; ++r) levels[r] = x.levels + (first + r) * x.width + g * GROUP;
    for (int half = 0; half < 2; ++half)
      group_dots<R, BITS, VNNI>(qs, widen(w.sc + at * TILE_ROWS + half * 8), levels, half, dot + half * R);
  }
  for (int64_t g = b * per_block; g < (b + 1) * per_block; g += 2) {  // offsets: m as int16 pairs times two group sums
    for (int half = 0; half < 2; ++half) {
      const uint8_t* m = w.m + (tile * w.groups + g) * TILE_ROWS + half * 16;
      const __m256i mins = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(m)));
      for (int r = 0; r < R; ++r) {
        const __m256i sums = broadcast4(x.sums + (first + r) * w.groups + g);
        offset[half * R + r] = _mm256_add_epi32(offset[half * R + r], _mm256_madd_epi16(mins, sums));
      }
    }
  }
}

template <int R, int BITS, bool VNNI>
void rows_of_tile(const Tiles& w, const Rows& x, const Job& job, int64_t first) {
  float* out[R];
  for (int r = 0; r < R; ++r) out[r] = job.out + (first + r) * job.stride + job.tile * TILE_ROWS;
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < 2; ++h) _mm256_storeu_ps(out[r] + h * 8, _mm256_setzero_ps());
  for (int64_t b = 0; b < w.blocks; ++b) {
    __m256i dot[2 * R], offset[2 * R];
    block_sums<R, BITS, VNNI>(w, x, job.tile, first, b, dot, offset);
    for (int h = 0; h < 2; ++h) {
      const int64_t lanes = (job.tile * w.blocks + b) * TILE_ROWS + h * 8;
      const __m256 d = _mm256_loadu_ps(w.d + lanes), dmin = _mm256_loadu_ps(w.dmin + lanes);
      for (int r = 0; r < R; ++r) {
        const __m256 scale = _mm256_set1_ps(x.scales[(first + r) * w.blocks + b]);
        __m256 total = _mm256_loadu_ps(out[r] + h * 8);
        total = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[h * R + r]), _mm256_mul_ps(d, scale), total);
        total = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(offset[h * R + r]), _mm256_mul_ps(dmin, scale), total);
        _mm256_storeu_ps(out[r] + h * 8, total);
      }
    }
  }
}

template <int BITS, bool VNNI>
void tile_rows(const Tiles& w, const Rows& x, const Job& job) {
  in_chunks<MAX_ROWS>(job, [&](auto rows, int64_t first) { rows_of_tile<decltype(rows)::value, BITS, VNNI>(w, x, job, first); });
}

template <bool VNNI>
void tile_256(const Tiles& w, const Rows& x, const Job& job) {
  switch (w.bits) {
    case 4: return tile_rows<4, VNNI>(w, x, job);
    case 6: return tile_rows<6, VNNI>(w, x, job);
    default: return tile_rows<7, VNNI>(w, x, job);
  }
}

}  // namespace
}  // namespace q4
