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
// The same for blocks of one group (group_rows_of_tile): 8, the second pass of 9 to 16 rows reading the tile's groups
// from L2. Against 16 (Zen 5, a 7B-shape layer, in turns): 5 rows the same, 9 rows 5-10% slower (Q4_0 4.8-5.3 ms
// against 4.6-4.7), and this file compiles in 15.5 s, not 21-26 (a copy of the code for each count and kind of
// levels), the whole kernel in 28 s.
constexpr int GROUP_ROWS = 8;


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

// Blocks of one 32-group (a GGUF's Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) for R rows from `first`: the same sums and
// float steps as rows_of_tile, in the same order, so the same bits, but with a float step for every group rather
// than every 8, what is spent once a row is what counts. So each row's outputs stay in registers from the first
// group to the last; with unit scales no scale multiplies the sums; the offset, m·Σx (below 2^24 in magnitude), is
// made exact in float (m and the sum as floats, their product), not in int32 and converted; and where dmin is d
// (the symmetric types) one product d·xs serves both steps. Against rows_of_tile, a 7B-shape layer (Zen 5, 2 threads,
// `python -m specchat.bench.profile --layer-types Q4_0`, two runs each): Q4_0 T(5)/T(1) 1.47–1.52 → 1.21–1.32,
// T(9)/T(1) 2.27–2.42 → 1.49–2.10 (Q4_K's own: 1.07–1.47, 1.33–1.93 in the same runs).
template <int R, int BITS, bool SAME>
void group_rows_of_tile(const Tiles& w, const Rows& x, const Job& job, int64_t first) {
  constexpr int64_t BYTES = TILE_ROWS * group_bytes(BITS);
  __m512 total[R];
  for (int r = 0; r < R; ++r) total[r] = _mm512_setzero_ps();
  const int8_t* levels[R];
  for (int r = 0; r < R; ++r) levels[r] = x.levels + (first + r) * x.width;
  for (int64_t g = 0; g < w.groups; ++g) {
    const int64_t at = job.tile * w.groups + g;
    const uint8_t* qs = w.qs + at * BYTES;
    ask_ahead(qs, BYTES);
    __m512i v[8];
    unpack<BITS>(qs, v);
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.d + at * TILE_ROWS)));
    const __m512 dmin = SAME ? d : _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.dmin + at * TILE_ROWS)));
    const __m512i pairs = widen16(w.m + (at - g % 2) * TILE_ROWS);  // rows' m of groups g - g%2 and its next as int16 pairs
    const __m512 mins = _mm512_cvtepi32_ps(g % 2 ? _mm512_srli_epi32(pairs, 16) : _mm512_and_si512(pairs, _mm512_set1_epi32(0xFFFF)));
    for (int r = 0; r < R; ++r) {
      const int8_t* group = levels[r] + g * GROUP;
      __m512i even = _mm512_setzero_si512(), odd = _mm512_setzero_si512();
      for (int q = 0; q < 8; q += 2) {
        even = _mm512_dpbusd_epi32(even, v[q], broadcast4(group + 4 * q));
        odd = _mm512_dpbusd_epi32(odd, v[q + 1], broadcast4(group + 4 * q + 4));
      }
      const __m512i dot = _mm512_add_epi32(even, odd);
      const __m512 scale = _mm512_set1_ps(x.scales[(first + r) * w.blocks + g]);
      const __m512 offset = _mm512_mul_ps(mins, _mm512_set1_ps(x.float_sums[(first + r) * w.groups + g]));
      const __m512 d_scale = _mm512_mul_ps(d, scale);
      total[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), d_scale, total[r]);
      total[r] = _mm512_fnmadd_ps(offset, SAME ? d_scale : _mm512_mul_ps(dmin, scale), total[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(job.out + (first + r) * job.stride + job.tile * TILE_ROWS, total[r]);
}

template <int BITS, bool HALVES>
void tile_rows(const Tiles& w, const Rows& x, const Job& job) {
  if constexpr (!HALVES) {
    if (w.unit_scales) {  // blocks of one group, as a GGUF's are: scales of their own take rows_of_tile
      const auto run = [&](auto same) {
        in_chunks<GROUP_ROWS>(job, [&](auto rows, int64_t first) {
          group_rows_of_tile<decltype(rows)::value, BITS, decltype(same)::value>(w, x, job, first);
        });
      };
      return w.dmin == w.d ? run(Count<1>{}) : run(Count<0>{});
    }
  }
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
