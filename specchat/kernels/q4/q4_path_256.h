// The w4a8 product on 256-bit vectors, for the AVX2 and AVX-VNNI paths (q4_path_avx2.cpp,
// q4_path_avx_vnni.cpp include it, each under its own instruction-set target). A tile is two halves
// of 8 output rows, one int32 lane each (layout: q4_tiles.h).
//
// A job of one or two rows (a decode step; on AVX2 up to 5, and with 4-bit levels up to 10 in two passes over the
// tile, the second from cache) unpacks each group's levels in registers as it goes. A longer job walks the tile block by block: a block's levels are unpacked once into a byte a level
// (and its group scales widened once), then every activation row of the job reads them, MAX_ROWS rows
// at a time and one half of the tile at a time, so a long prompt pays the unpacking once per block,
// not once per row (6-bit levels: twice the speed at 128 rows), and the sums stay in registers.
//   AVX-VNNI: `vpdpbusd` adds four level × activation products into each lane.
//   AVX2: `maddubs` gives int16 pair sums, added in int16 for as many vectors as cannot overflow
//   (4-bit: 8, 6-bit: 2), then `madd` with the group's scale folds them into int32. 8-bit levels L would
//   saturate it (255·127·2 > 32767): their signed l = L − 128 goes through it as |l| and x signed as l
//   (`sign`: 128·127·2 fits), and 128·sc·Σx, from the rows' group sums, is added back.
// Both give the exact integer sums every path gives.
#pragma once
#include <immintrin.h>
#include <cstdint>

#include "q4_tiles.h"

namespace q4 {
namespace {

constexpr int DIRECT_ROWS = 2;       // jobs of at most this many rows unpack each group in registers (measured faster)
constexpr int DIRECT_ROWS_AVX2 = 5;  // the AVX2 path's (maddubs, no VNNI): on a Zen 3 the bundled target's 3 rows took
                                     // 83-100 ms so against 118-126 unpacked, 5 rows 150-157 against 170-174
constexpr int MAX_ROWS = 4;          // activation rows per pass over an unpacked block (their sums stay in registers)
constexpr int GROUP_ROWS_AVX2 = 6;   // the AVX2 path's rows per pass over blocks of one group (group_rows): on a Zen 3,
                                     // one thread, a 512 × 3584 product from cache, 5 rows 0.83-0.89 and 6 rows
                                     // 0.86-0.94 of the time 4 a pass took, 9-17 rows 0.91-0.96 (bits the same)
constexpr int64_t MAX_GROUPS = MAX_BLOCK_GROUPS;  // 32-groups a block holds at most (256 inputs)

// One block of a tile, unpacked: vector q of group g holds L[j][4q..4q+3] at bytes 4j..4j+3 (rows
// 0-7 in the first 32 bytes, 8-15 in the next); each group's scales per half of the tile as int32 lanes
// (scales[g][s][half]: s 0, and with halves s 1 for the group's last 16 inputs).
struct Unpacked {
  alignas(32) uint8_t levels[MAX_GROUPS][8][64];
  alignas(32) int32_t scales[MAX_GROUPS][2][2][8];
};

// The scales of rows 8h..8h+7 of the group at `at` as int32 lanes: scales[0], and with halves scales[1] (the
// group's last 16 inputs; signed).
template <bool HALVES>
inline void group_scales(const Tiles& w, int64_t at, int half, __m256i* scales) {
  if constexpr (HALVES) {
    for (int s = 0; s < 2; ++s)
      scales[s] = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.sc + (2 * at + s) * TILE_ROWS + half * 8)));
  } else {
    scales[0] = w.unit_scales ? _mm256_set1_epi32(1)
                              : _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.sc + at * TILE_ROWS + half * 8)));
  }
}

// Rows 8h..8h+7 of level vector q of one group.
template <int BITS>
inline __m256i level_vector(const uint8_t* qs, int q, int half) {
  if constexpr (BITS == 8) {
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
    if constexpr (BITS == TABLE)  // each index's level, the table in both 128-bit lanes
      v = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(IQ4_LEVELS))), v);
    return v;
  }
}

// Row `row`'s sum of levels of group g: one int16, or with halves its first and last 16 inputs' side by side.
template <bool HALVES>
inline const int16_t* group_sums(const Tiles& w, const Rows& x, int64_t row, int64_t g) {
  return HALVES ? x.half_sums + (row * w.groups + g) * 2 : x.sums + row * w.groups + g;
}

// Each lane's int32 scale in both its int16 halves (a negative one's low 16 bits): what `madd` multiplies a lane's
// two int16 pair sums by.
inline __m256i scale_pairs_of(__m256i scales) {
  return _mm256_or_si256(_mm256_and_si256(scales, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(scales, 16));
}

// Keeps v in a register at this point: GCC may not reassociate the sums it is part of across it.
inline void pin(__m256i& v) {
#if defined(__GNUC__)
  __asm__("" : "+x"(v));
#endif
}

// Four activation levels in every lane (or two int16 group sums).
inline __m256i broadcast4(const void* bytes) {
  int32_t quad;
  __builtin_memcpy(&quad, bytes, 4);
  return _mm256_set1_epi32(quad);
}

// Block b's offset sums (q4_tiles.h) of one half of the tile for R rows from `first`: m as int16 pairs (signed with
// halves) times each step's pair of activation sums (step_mins, step_sums).
template <int R, bool HALVES>
inline void block_offsets(const Tiles& w, const Rows& x, int64_t tile, int64_t first, int64_t b, int half, __m256i* offset) {
  const int64_t per_block = w.groups / w.blocks;
  for (int r = 0; r < R; ++r) offset[r] = _mm256_setzero_si256();
  for (int64_t g = b * per_block; g < (b + 1) * per_block; g += HALVES ? 1 : 2) {
    const __m128i m = _mm_loadu_si128(reinterpret_cast<const __m128i*>(step_mins<HALVES>(w, tile, g) + half * 16));
    const __m256i mins = HALVES ? _mm256_cvtepi8_epi16(m) : _mm256_cvtepu8_epi16(m);
    for (int r = 0; r < R; ++r)
      offset[r] = _mm256_add_epi32(offset[r], _mm256_madd_epi16(mins, _mm256_set1_epi32(step_sums<HALVES>(w, x, first + r, g))));
  }
}

// out += block b's part for R rows from `first`, half h of the tile, from its dot and offset sums:
// out = fma(dot, d·xs, out); out = fma(−offset, dmin·xs, out).
template <int R>
inline void add_block(const Tiles& w, const Rows& x, const Job& job, int64_t b, int64_t first, int h, const __m256i* dot,
                      const __m256i* offset) {
  const int64_t lanes = (job.tile * w.blocks + b) * TILE_ROWS + h * 8;
  const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.d + lanes)));
  const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.dmin + lanes)));
  for (int r = 0; r < R; ++r) {
    float* out = job.out + (first + r) * job.stride + job.tile * TILE_ROWS + h * 8;
    const __m256 scale = _mm256_set1_ps(x.scales[(first + r) * w.blocks + b]);
    __m256 total = _mm256_loadu_ps(out);
    total = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r]), _mm256_mul_ps(d, scale), total);
    total = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(offset[r]), _mm256_mul_ps(dmin, scale), total);
    _mm256_storeu_ps(out, total);
  }
}

// One group's Σ sc·L·x for R rows (levels: each row's 32 activation levels of the group; sums: each row's sum of them,
// with halves the sums of its first and last 16), added to dot (int32 lanes). level_vector(q): the group's level
// vector q for this half of the tile; scales[0] (and with halves scales[1], for vectors 4-7: the group's last 16
// inputs) as int32 lanes, signed or not.
template <int R, int BITS, bool VNNI, bool HALVES, typename LevelVector>
inline void group_dots(LevelVector level_vector, const __m256i* scales, const int8_t* const* levels,
                       const int16_t* const* sums, __m256i* dot) {
  constexpr int RUN = BITS == 4 ? (HALVES ? 4 : 8) : BITS == 6 ? 2 : 1;  // int16 sums never cross a half (8, TABLE: 1)
  constexpr int SCALES = HALVES ? 2 : 1;
  __m256i scale_pairs[SCALES];
  for (int s = 0; s < SCALES; ++s) scale_pairs[s] = scale_pairs_of(scales[s]);
  if constexpr (!VNNI && !HALVES && BITS == 4) {
    // 4-bit levels with maddubs: the group's 8 level vectors held in registers, then each row in turn, its int16 run
    // kept in one register (`pin`): left free, GCC summed a row's 8 products as a tree whose temporaries (5 rows: 40)
    // spilled to the stack, twice the instructions of the multiplies. (6- and 8-bit levels measured no better so.)
    __m256i v[8];
#pragma GCC unroll 8
    for (int q = 0; q < 8; ++q) v[q] = level_vector(q);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      __m256i acc = _mm256_setzero_si256();  // a run of all 8 (RUN)
#pragma GCC unroll 8
      for (int q = 0; q < 8; ++q) {
        acc = _mm256_add_epi16(acc, _mm256_maddubs_epi16(v[q], broadcast4(levels[r] + 4 * q)));
        pin(acc);
      }
      dot[r] = _mm256_add_epi32(dot[r], _mm256_madd_epi16(acc, scale_pairs[0]));
    }
    return;
  }
  __m256i acc[SCALES][R];
  for (int s = 0; s < SCALES; ++s)
    for (int r = 0; r < R; ++r) acc[s][r] = _mm256_setzero_si256();
#pragma GCC unroll 8
  for (int q = 0; q < 8; ++q) {
    const __m256i v = level_vector(q);
    const int s = HALVES && q >= 4;
    const __m256i signed_levels = _mm256_xor_si256(v, _mm256_set1_epi8(-128));  // 8-bit levels L as l = L − 128
    const __m256i magnitudes = _mm256_abs_epi8(signed_levels);                  // |−128| is 128 read unsigned
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256i x = broadcast4(levels[r] + 4 * q);
      if constexpr (VNNI) {
        acc[s][r] = _mm256_dpbusd_avx_epi32(acc[s][r], v, x);
      } else if constexpr (BITS != 8 && BITS != TABLE) {
        acc[s][r] = _mm256_add_epi16(acc[s][r], _mm256_maddubs_epi16(v, x));
        if ((q + 1) % RUN == 0) {
          dot[r] = _mm256_add_epi32(dot[r], _mm256_madd_epi16(acc[s][r], scale_pairs[s]));
          acc[s][r] = _mm256_setzero_si256();
        }
      } else {  // 8-bit levels: maddubs(|l|, x signed as l) = l·x, pairs at most 2·128·127 (|x| ≤ 127)
        const __m256i products = _mm256_maddubs_epi16(magnitudes, _mm256_sign_epi8(x, signed_levels));
        dot[r] = _mm256_add_epi32(dot[r], _mm256_madd_epi16(products, scale_pairs[s]));
      }
    }
  }
  if constexpr (!VNNI && (BITS == 8 || BITS == TABLE))  // and the 128·Σx the signed levels left out, times the scale
    for (int r = 0; r < R; ++r)
      for (int s = 0; s < SCALES; ++s) {
        const __m256i sum = _mm256_set1_epi32(static_cast<uint16_t>(sums[r][s]));  // (Σx, 0): madd gives sc·Σx
        dot[r] = _mm256_add_epi32(dot[r], _mm256_slli_epi32(_mm256_madd_epi16(scale_pairs[s], sum), 7));
      }
  if constexpr (VNNI)
    for (int s = 0; s < SCALES; ++s)
      for (int r = 0; r < R; ++r) dot[r] = _mm256_add_epi32(dot[r], _mm256_mullo_epi32(acc[s][r], scales[s]));
}

// 4-bit levels with maddubs (no halves), both halves of the tile a level vector at a time: each row's broadcast
// serves 16 output rows, and the 2R int16 sums stay pinned in registers. Measured on a Zen 3 (one thread, one
// 512 × 1536 Q4_K product from cache): 5 rows 0.05 against 0.08-0.10 ms a half at a time; 1 row the same.
template <int R>
inline void both_halves_dots4(const Tiles& w, int64_t at, const uint8_t* qs, const int8_t* const* levels, __m256i* dot) {
  __m256i pairs[2];
  for (int half = 0; half < 2; ++half) {
    __m256i scales[2];
    group_scales<false>(w, at, half, scales);
    pairs[half] = scale_pairs_of(scales[0]);
  }
  __m256i acc[2][R];
  for (int h = 0; h < 2; ++h)
    for (int r = 0; r < R; ++r) acc[h][r] = _mm256_setzero_si256();
#pragma GCC unroll 8
  for (int q = 0; q < 8; ++q) {
    const __m256i v0 = level_vector<4>(qs, q, 0), v1 = level_vector<4>(qs, q, 1);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256i x = broadcast4(levels[r] + 4 * q);
      acc[0][r] = _mm256_add_epi16(acc[0][r], _mm256_maddubs_epi16(v0, x));
      acc[1][r] = _mm256_add_epi16(acc[1][r], _mm256_maddubs_epi16(v1, x));
      pin(acc[0][r]);
      pin(acc[1][r]);
    }
  }
  for (int h = 0; h < 2; ++h)  // 8 int16 products of 4-bit levels never overflow (the run of group_dots)
    for (int r = 0; r < R; ++r) dot[h * R + r] = _mm256_add_epi32(dot[h * R + r], _mm256_madd_epi16(acc[h][r], pairs[h]));
}

// 6-bit levels with a scale per 16 inputs (a GGUF's Q6_K), both halves of the tile a pair of level vectors at a time:
// each row's broadcasts serve 16 output rows, and a pair's two products (the most an int16 sum of 6-bit levels holds)
// fold into int32 at once. One 512 × 1536 Q6_K product from cache on a Zen 3, one thread: 3-5 rows 0.8 of the
// time a half at a time took; 1 row the same.
template <int R>
inline void both_halves_dots6(const Tiles& w, int64_t at, const uint8_t* qs, const int8_t* const* levels, __m256i* dot) {
  __m256i pairs[2][2];
  for (int half = 0; half < 2; ++half) {
    __m256i scales[2];
    group_scales<true>(w, at, half, scales);
    for (int s = 0; s < 2; ++s) pairs[half][s] = scale_pairs_of(scales[s]);
  }
#pragma GCC unroll 4
  for (int q = 0; q < 8; q += 2) {
    const int s = q >= 4;
    const __m256i a0 = level_vector<6>(qs, q, 0), b0 = level_vector<6>(qs, q + 1, 0);
    const __m256i a1 = level_vector<6>(qs, q, 1), b1 = level_vector<6>(qs, q + 1, 1);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256i xa = broadcast4(levels[r] + 4 * q), xb = broadcast4(levels[r] + 4 * q + 4);
      __m256i acc0 = _mm256_add_epi16(_mm256_maddubs_epi16(a0, xa), _mm256_maddubs_epi16(b0, xb));
      __m256i acc1 = _mm256_add_epi16(_mm256_maddubs_epi16(a1, xa), _mm256_maddubs_epi16(b1, xb));
      dot[r] = _mm256_add_epi32(dot[r], _mm256_madd_epi16(acc0, pairs[0][s]));
      dot[R + r] = _mm256_add_epi32(dot[R + r], _mm256_madd_epi16(acc1, pairs[1][s]));
    }
  }
}

// ----- few rows (a decode step): each group unpacked in registers, both halves in one pass, so each
// cache line of weights is read once from memory -----

// Block b's dot sums (q4_tiles.h) of both halves for R activation rows from `first` (dot[h·R + r]),
// unpacked in registers; it asks for the weights ahead (ask_ahead).
template <int R, int BITS, bool VNNI, bool HALVES>
inline void direct_block_dots(const Tiles& w, const Rows& x, int64_t tile, int64_t first, int64_t b, __m256i* dot) {
  constexpr int64_t BYTES = TILE_ROWS * group_bytes(BITS);
  const int64_t per_block = w.groups / w.blocks;
  for (int i = 0; i < 2 * R; ++i) dot[i] = _mm256_setzero_si256();
  for (int64_t g = b * per_block; g < (b + 1) * per_block; ++g) {
    const int64_t at = tile * w.groups + g;
    const uint8_t* qs = w.qs + at * BYTES;
    ask_ahead(qs, BYTES);
    const int8_t* levels[R];
    for (int r = 0; r < R; ++r) levels[r] = x.levels + (first + r) * x.width + g * GROUP;
    if constexpr (!VNNI && !HALVES && BITS == 4) {
      both_halves_dots4<R>(w, at, qs, levels, dot);
      continue;
    }
    if constexpr (!VNNI && HALVES && BITS == 6) {
      both_halves_dots6<R>(w, at, qs, levels, dot);
      continue;
    }
    const int16_t* sums[R];
    for (int r = 0; r < R; ++r) sums[r] = group_sums<HALVES>(w, x, first + r, g);
    for (int half = 0; half < 2; ++half) {
      __m256i scales[2];
      group_scales<HALVES>(w, at, half, scales);
      group_dots<R, BITS, VNNI, HALVES>([&](int q) { return level_vector<BITS>(qs, q, half); }, scales, levels, sums, dot + half * R);
    }
  }
}

template <int R, int BITS, bool VNNI, bool HALVES>
void direct_rows(const Tiles& w, const Rows& x, const Job& job, int64_t first) {
  for (int64_t b = 0; b < w.blocks; ++b) {
    __m256i dot[2 * R], offset[R];
    direct_block_dots<R, BITS, VNNI, HALVES>(w, x, job.tile, first, b, dot);
    for (int h = 0; h < 2; ++h) {
      block_offsets<R, HALVES>(w, x, job.tile, first, b, h, offset);
      add_block<R>(w, x, job, b, first, h, dot + h * R, offset);
    }
  }
}

// ----- many rows: each block unpacked once for all of them -----

// Block b of tile `tile` into `into`, asking for the weights ahead (ask_ahead; a verification's
// few rows would wait on memory otherwise).
template <int BITS, bool HALVES>
inline void unpack_block(const Tiles& w, int64_t tile, int64_t b, Unpacked& into) {
  constexpr int64_t BYTES = TILE_ROWS * group_bytes(BITS);
  const int64_t per_block = w.groups / w.blocks;
  for (int64_t g = 0; g < per_block; ++g) {
    const int64_t at = tile * w.groups + b * per_block + g;
    const uint8_t* qs = w.qs + at * BYTES;
    ask_ahead(qs, BYTES);
    for (int half = 0; half < 2; ++half) {
      for (int q = 0; q < 8; ++q)
        _mm256_store_si256(reinterpret_cast<__m256i*>(into.levels[g][q] + half * 32), level_vector<BITS>(qs, q, half));
      __m256i scales[2];
      group_scales<HALVES>(w, at, half, scales);
      for (int s = 0; s < (HALVES ? 2 : 1); ++s) _mm256_store_si256(reinterpret_cast<__m256i*>(into.scales[g][s][half]), scales[s]);
    }
  }
}

// Block b's dot sums (q4_tiles.h) of one half of the tile for R activation rows (levels: each row's
// first level of the block).
template <int R, int BITS, bool VNNI, bool HALVES>
inline void block_dots(const Unpacked& u, int64_t per_block, const int8_t* const* levels, const int16_t* const* sums,
                       int half, __m256i* dot) {
  for (int r = 0; r < R; ++r) dot[r] = _mm256_setzero_si256();
  for (int64_t g = 0; g < per_block; ++g) {
    const int8_t* group[R];
    const int16_t* group_sum[R];
    for (int r = 0; r < R; ++r) {
      group[r] = levels[r] + g * GROUP;
      group_sum[r] = sums[r] + (HALVES ? 2 : 1) * g;
    }
    const auto vector = [&](int q) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(u.levels[g][q] + half * 32)); };
    __m256i scales[2];
    for (int s = 0; s < (HALVES ? 2 : 1); ++s) scales[s] = _mm256_load_si256(reinterpret_cast<const __m256i*>(u.scales[g][s][half]));
    group_dots<R, BITS, VNNI, HALVES>(vector, scales, group, group_sum, dot);
  }
}

// Block b of the tile (unpacked in u) for R activation rows from `first`, one half after the other.
template <int R, int BITS, bool VNNI, bool HALVES>
void block_rows(const Tiles& w, const Rows& x, const Job& job, const Unpacked& u, int64_t b, int64_t first) {
  const int64_t per_block = w.groups / w.blocks;
  const int8_t* levels[R];
  const int16_t* sums[R];
  for (int r = 0; r < R; ++r) {
    levels[r] = x.levels + (first + r) * x.width + b * per_block * GROUP;
    sums[r] = group_sums<HALVES>(w, x, first + r, b * per_block);
  }
  for (int h = 0; h < 2; ++h) {
    __m256i dot[R], offset[R];
    block_dots<R, BITS, VNNI, HALVES>(u, per_block, levels, sums, h, dot);
    block_offsets<R, HALVES>(w, x, job.tile, first, b, h, offset);
    add_block<R>(w, x, job, b, first, h, dot, offset);
  }
}

template <int BITS, bool VNNI, bool HALVES>
void tile_rows(const Tiles& w, const Rows& x, const Job& job) {
  for (int64_t r = 0; r < job.count; ++r)
    for (int h = 0; h < 2; ++h) _mm256_storeu_ps(job.out + (job.first + r) * job.stride + job.tile * TILE_ROWS + h * 8, _mm256_setzero_ps());
  constexpr int DIRECT = VNNI ? DIRECT_ROWS : DIRECT_ROWS_AVX2;
  // 4-bit levels on AVX2: up to two passes of direct rows beat one unpacking (the second pass reads the tile's
  // groups from cache)
  constexpr int DIRECT_JOB = !VNNI && !HALVES && BITS == 4 ? 2 * DIRECT : DIRECT;
  if (job.count <= DIRECT_JOB)
    return in_chunks<DIRECT>(job, [&](auto rows, int64_t first) { direct_rows<decltype(rows)::value, BITS, VNNI, HALVES>(w, x, job, first); });
  Unpacked u;
  for (int64_t b = 0; b < w.blocks; ++b) {
    unpack_block<BITS, HALVES>(w, job.tile, b, u);
    in_chunks<MAX_ROWS>(job, [&](auto rows, int64_t first) { block_rows<decltype(rows)::value, BITS, VNNI, HALVES>(w, x, job, u, b, first); });
  }
}

// ----- blocks of one 32-group (a GGUF's Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL): a float step every group -----

// Rows first..first+R−1 of the job, half h of the tile after half h−1 (the second reads the groups from cache): the
// sums and float steps of add_block in the same order, so the same bits, each row's outputs kept in registers
// from the first group to the last, the offset m·Σx made in float (exact: below 2^24), and one d·xs for both steps
// where dmin is d (as q4_path_avx512_vnni.cpp's group_rows_of_tile).
template <int R, int BITS, bool VNNI, bool SAME>
void group_rows(const Tiles& w, const Rows& x, const Job& job, int64_t first) {
  constexpr int64_t BYTES = TILE_ROWS * group_bytes(BITS);
  for (int h = 0; h < 2; ++h) {
    __m256 total[R];
    for (int r = 0; r < R; ++r) total[r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < w.groups; ++g) {
      const int64_t at = job.tile * w.groups + g;
      const uint8_t* qs = w.qs + at * BYTES;
      if (h == 0) ask_ahead(qs, BYTES);
      __m256i scales[2], dot[R];
      group_scales<false>(w, at, h, scales);
      const int8_t* levels[R];
      const int16_t* sums[R];
      for (int r = 0; r < R; ++r) {
        levels[r] = x.levels + (first + r) * x.width + g * GROUP;
        sums[r] = group_sums<false>(w, x, first + r, g);
        dot[r] = _mm256_setzero_si256();
      }
      group_dots<R, BITS, VNNI, false>([&](int q) { return level_vector<BITS>(qs, q, h); }, scales, levels, sums, dot);
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.d + at * TILE_ROWS + h * 8)));
      const __m256 dmin = SAME ? d : _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.dmin + at * TILE_ROWS + h * 8)));
      const __m256i pairs = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.m + (at - g % 2) * TILE_ROWS + h * 16)));
      const __m256 mins = _mm256_cvtepi32_ps(g % 2 ? _mm256_srli_epi32(pairs, 16) : _mm256_and_si256(pairs, _mm256_set1_epi32(0xFFFF)));
      for (int r = 0; r < R; ++r) {
        const __m256 scale = _mm256_set1_ps(x.scales[(first + r) * w.blocks + g]);
        const __m256 offset = _mm256_mul_ps(mins, _mm256_set1_ps(x.float_sums[(first + r) * w.groups + g]));
        const __m256 d_scale = _mm256_mul_ps(d, scale);
        total[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r]), d_scale, total[r]);
        total[r] = _mm256_fnmadd_ps(offset, SAME ? d_scale : _mm256_mul_ps(dmin, scale), total[r]);
      }
    }
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(job.out + (first + r) * job.stride + job.tile * TILE_ROWS + h * 8, total[r]);
  }
}

// Jobs of more than DIRECT_ROWS rows (a verification, a prompt); a decode step's row runs direct_rows, both halves of
// a group in one pass: on Zen 5 forced to this path, a 7B-shape Q4_0 layer's one row took 6% longer here (Q8_0 15%),
// its 5 rows 30% less time, 9 rows 33% less (`python -m specchat.bench.profile --layer-types`).
template <int BITS, bool VNNI>
void group_tile_rows(const Tiles& w, const Rows& x, const Job& job) {
  if (job.count <= DIRECT_ROWS) return tile_rows<BITS, VNNI, false>(w, x, job);
  const auto run = [&](auto same) {
    in_chunks<VNNI ? MAX_ROWS : GROUP_ROWS_AVX2>(job, [&](auto rows, int64_t first) {
      group_rows<decltype(rows)::value, BITS, VNNI, decltype(same)::value>(w, x, job, first);
    });
  };
  return w.dmin == w.d ? run(Count<1>{}) : run(Count<0>{});
}

template <bool VNNI>
void tile_256(const Tiles& w, const Rows& x, const Job& job) {
  with_bits(w.bits, [&](auto bits) {
    if (w.halves) tile_rows<decltype(bits)::value, VNNI, true>(w, x, job);
    else if (w.groups == w.blocks) group_tile_rows<decltype(bits)::value, VNNI>(w, x, job);
    else tile_rows<decltype(bits)::value, VNNI, false>(w, x, job);
  });
}

}  // namespace
}  // namespace q4
