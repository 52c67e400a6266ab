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

#include "q4_path_512.h"

namespace q4 {
namespace {

// Activation rows per pass over a tile's weights (their sums stay in registers): 16, so a verification of up
// to 16 rows streams the weights once (the bundled pair's layers on a Xeon, against 8: 9 rows 16% faster, 12
// rows 13%, 5 rows the same).
constexpr int MAX_ROWS = 16;

// Group g's Σ L·x for R rows, then times the group's scales into dot. With one or two rows the
// products go to two accumulators (half the chain of dependent `vpdpbusd`s); halves: the two are the
// group's first and last 16 inputs, each times its own scales.
template <int R, bool HALVES>
inline void group_dots(const __m512i* v, const __m512i* scales, const int8_t* const* levels, __m512i* dot) {
  for (int r = 0; r < R; ++r) {
    __m512i even = _mm512_setzero_si512(), odd = _mm512_setzero_si512();
    if constexpr (HALVES) {
      for (int q = 0; q < 4; ++q) {
        even = _mm512_dpbusd_epi32(even, v[q], broadcast4(levels[r] + 4 * q));
        odd = _mm512_dpbusd_epi32(odd, v[q + 4], broadcast4(levels[r] + 4 * q + 16));
      }
      dot[r] = _mm512_add_epi32(dot[r], _mm512_add_epi32(_mm512_mullo_epi32(even, scales[0]), _mm512_mullo_epi32(odd, scales[1])));
      continue;
    }
    for (int q = 0; q < 8; q += 2) {
      even = _mm512_dpbusd_epi32(even, v[q], broadcast4(levels[r] + 4 * q));
      if constexpr (R <= 2) odd = _mm512_dpbusd_epi32(odd, v[q + 1], broadcast4(levels[r] + 4 * q + 4));
      else even = _mm512_dpbusd_epi32(even, v[q + 1], broadcast4(levels[r] + 4 * q + 4));
    }
    if constexpr (R <= 2) even = _mm512_add_epi32(even, odd);
    dot[r] = _mm512_add_epi32(dot[r], _mm512_mullo_epi32(even, scales[0]));
  }
}

// Block b's dot sums (q4_tiles.h) for R activation rows from `first`, asking for the weights ahead (ask_ahead).
template <int R, int BITS, bool HALVES>
inline void block_dots(const Tiles& w, const Rows& x, int64_t tile, int64_t first, int64_t b, __m512i* dot) {
  constexpr int64_t BYTES = TILE_ROWS * group_bytes(BITS);
  const int64_t per_block = w.groups / w.blocks;
  for (int r = 0; r < R; ++r) dot[r] = _mm512_setzero_si512();
  for (int64_t g = b * per_block; g < (b + 1) * per_block; ++g) {
    const int64_t at = tile * w.groups + g;
    const uint8_t* qs = w.qs + at * BYTES;
    ask_ahead(qs, BYTES);
    __m512i v[8];
    unpack<BITS>(qs, v);
    const int8_t* levels[R];
    for (int r = 0; r < R; ++r) levels[r] = x.levels + (first + r) * x.width + g * GROUP;
    __m512i scales[2];
    group_scales<HALVES>(w, at, scales);
    group_dots<R, HALVES>(v, scales, levels, dot);
  }
}

template <int R, int BITS, bool HALVES>
void rows_of_tile(const Tiles& w, const Rows& x, const Job& job, int64_t first) {
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(job.out + (first + r) * job.stride + job.tile * TILE_ROWS, _mm512_setzero_ps());
  for (int64_t b = 0; b < w.blocks; ++b) {
    __m512i dot[R], offset[R];
    block_dots<R, BITS, HALVES>(w, x, job.tile, first, b, dot);
    block_offsets<R, HALVES>(w, x, job.tile, first, b, offset);
    add_block<R>(w, x, job, b, first, dot, offset);
  }
}

template <int BITS, bool HALVES>
void tile_rows(const Tiles& w, const Rows& x, const Job& job) {
  in_chunks<MAX_ROWS>(job, [&](auto rows, int64_t first) { rows_of_tile<decltype(rows)::value, BITS, HALVES>(w, x, job, first); });
}

}  // namespace

void tile_avx512_vnni(const Tiles& w, const Rows& x, const Job& job) {
  with_bits(w.bits, [&](auto bits) {
    if (w.halves) tile_rows<decltype(bits)::value, true>(w, x, job);
    else tile_rows<decltype(bits)::value, false>(w, x, job);
  });
}

}  // namespace q4

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
