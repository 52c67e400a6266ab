// The w4a8 product with AMX-INT8 tiles, for a job of 32 activation rows and more (a prompt): one
// `tdpbsud` multiplies 16 activation rows by 64 inputs of the tile's 16 output rows (16·16·64 products)
// into an int32 tile. Fewer rows (a decode step, a verification) run the AVX-512 VNNI code, and so do
// the rows left over past the last 16. (Below 32 rows the VNNI code measured as fast or faster on the
// bundled pair's layers: 16 rows within 3%, 20 rows 9–14% faster than 16 tiled + 4. Tiles of one
// 32-group each, their sums scaled in registers, measured slower than VNNI below 9 rows: the round trip
// of levels and sums through memory for every group.)
//
// A tile multiply sums over 64 inputs, two 32-groups with scales of their own, so each block's levels
// are first multiplied by their group's scale (at most 255·255, 16 bits) and the products split into a
// low and a high byte, two tiles of unsigned levels: Σ sc·L·x = Σ low·x + 256·Σ high·x, summed per
// block in two int32 tiles, exact. That is the integer every path computes, and the float steps after
// it are the AVX-512 path's (q4_path_512.h), so this path gives the same bits as every other.
//
// A job takes a run of tiles (Path::tiles_a_job in q4_kernel.cpp) block by block, and within a block tile by
// tile: the rows' levels of a block are read once for all the run's tiles (a prompt's 128 rows of a 256-input
// block are 32 KB, as much as the L1 cache holds beside a scaled block). On a Xeon, against one tile a job
// (with the offsets' loop of the same change): the bundled target's layer stack 10% faster at 128 rows (a
// prompt's chunk), 20% at 256; the drafter's 7%.
//
// Where a prompt chunk's time goes (128 rows of a 1,792 x 1,536 layer, weights in cache, 2 threads, Xeon; each
// part removed in turn, one process): all 565 us; without the tile multiplies (and their stores) 320, without the
// float steps 385, without the scaling 494, without the offsets 509. The multiplies' 16 tdpbsud per 32 rows measure
// 4.6 ns each alone (a loop of them), about 100 us a thread, 120 with their stores: the tile half costs about
// twice its instructions, and the vector half (scaling, offsets, float steps) is the larger. Tried, no change:
// issuing the next chunk's multiplies before a chunk's float steps (sums in two buffers; 585 against 574 us), and
// activation rows padded to an odd number of cache lines (576 against 574).
//
// The OS must grant the process the tiles' state (Linux 5.16+: arch_prctl, asked in q4_kernel.cpp);
// each job loads the tile configuration and releases the tiles when done.
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#include <cstdint>

#include "q4_tiles.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma,amx-tile,amx-int8"))), apply_to = function)
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,fma,amx-tile,amx-int8")
#endif

#include "q4_path_512.h"

namespace q4 {
namespace {

constexpr int64_t CHUNK = 16;      // activation rows a tile holds
constexpr int64_t STEP = 64;       // inputs one tile multiply takes (16 vectors of the layout)
constexpr int64_t TILED_FROM = 32;  // rows a job needs to take the tiles
constexpr int64_t MAX_GROUPS = MAX_BLOCK_GROUPS;  // 32-groups a block holds at most (256 inputs)

// Tiles 0-3: the int32 sums (low, high) of the first and the second 16 rows; 4-5: their activations;
// 6-7: the block's scaled levels, low and high bytes. Each is 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

void configure_tiles() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.bytes_per_row[t] = 64;
    config.rows[t] = 16;
  }
  asm volatile("" : : "r"(&config) : "memory");  // the stores above reach memory: GCC may not see ldtilecfg read them
  _tile_loadconfig(&config);
}

// A block's levels times their group's scale, split into bytes: vector q of group g at [g·8 + q].
struct ScaledBlock {
  alignas(64) uint8_t low[MAX_GROUPS * 8][64];
  alignas(64) uint8_t high[MAX_GROUPS * 8][64];
};

template <int BITS>
void scale_block(const Tiles& w, int64_t tile, int64_t b, ScaledBlock& into) {
  constexpr int64_t BYTES = TILE_ROWS * group_bytes(BITS);
  const int64_t per_block = w.groups / w.blocks;
  const __m512i low_bytes = _mm512_set1_epi16(0x00FF);
  for (int64_t g = 0; g < per_block; ++g) {
    const int64_t at = tile * w.groups + b * per_block + g;
    __m512i v[8];
    unpack<BITS>(w.qs + at * BYTES, v);
    const __m512i scales = w.unit_scales ? _mm512_set1_epi32(1) : widen(w.sc + at * TILE_ROWS);  // in each lane's int16 halves
    const __m512i pairs = _mm512_or_si512(scales, _mm512_slli_epi32(scales, 16));
    for (int q = 0; q < 8; ++q) {
      const __m512i even = _mm512_mullo_epi16(_mm512_and_si512(v[q], low_bytes), pairs);
      const __m512i odd = _mm512_mullo_epi16(_mm512_srli_epi16(v[q], 8), pairs);
      _mm512_store_si512(into.low[g * 8 + q], _mm512_or_si512(_mm512_and_si512(even, low_bytes), _mm512_slli_epi16(odd, 8)));
      _mm512_store_si512(into.high[g * 8 + q], _mm512_or_si512(_mm512_srli_epi16(even, 8), _mm512_andnot_si512(low_bytes, odd)));
    }
  }
}

// The int32 sums of one block for 16 or 32 rows, as the tiles store them: [chunk][low|high][row][lane].
struct BlockSums {
  alignas(64) int32_t sums[2][2][CHUNK][TILE_ROWS];
};

// Block b's Σ low·x and Σ high·x for activation rows first..first+15 (and the next 16 when PAIR).
template <bool PAIR>
void multiply_block(const Rows& x, const ScaledBlock& s, int64_t per_block, int64_t b, int64_t first, BlockSums& out) {
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (PAIR) {
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t step = 0; step < per_block * GROUP / STEP; ++step) {
    const int8_t* a = x.levels + first * x.width + b * per_block * GROUP + step * STEP;
    _tile_loadd(4, a, x.width);
    _tile_loadd(6, s.low[step * 16], 64);
    _tile_loadd(7, s.high[step * 16], 64);
    _tile_dpbsud(0, 4, 6);
    _tile_dpbsud(1, 4, 7);
    if constexpr (PAIR) {
      _tile_loadd(5, a + CHUNK * x.width, x.width);
      _tile_dpbsud(2, 5, 6);
      _tile_dpbsud(3, 5, 7);
    }
  }
  _tile_stored(0, out.sums[0][0], 64);
  _tile_stored(1, out.sums[0][1], 64);
  if constexpr (PAIR) {
    _tile_stored(2, out.sums[1][0], 64);
    _tile_stored(3, out.sums[1][1], 64);
  }
}

// Block b's offset sums (q4_tiles.h) for the 16 rows from `first`: the block's PAIRS pairs of group offsets
// loaded once for all 16 rows, each row's sum a short chain and the rows side by side.
template <int PAIRS>
void chunk_offsets(const Tiles& w, const Rows& x, int64_t tile, int64_t first, int64_t b, __m512i* offset) {
  const int64_t g0 = b * PAIRS * 2;
  __m512i mins[PAIRS];
  for (int p = 0; p < PAIRS; ++p)
    mins[p] = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.m + (tile * w.groups + g0 + 2 * p) * TILE_ROWS)));
  for (int r = 0; r < CHUNK; ++r) {
    const int16_t* sums = x.sums + (first + r) * w.groups + g0;
    __m512i total = _mm512_setzero_si512();
    for (int p = 0; p < PAIRS; ++p) total = _mm512_dpwssd_epi32(total, mins[p], broadcast4(sums + 2 * p));
    offset[r] = total;
  }
}

// out += block b's part for the 16 rows from `first` (chunk c of the sums) in tile job.tile.
void add_chunk(const Tiles& w, const Rows& x, const Job& job, int64_t b, int64_t first, const BlockSums& s, int c) {
  __m512i offset[CHUNK];
  switch (w.groups / w.blocks / 2) {  // pairs of groups a block holds: 4, 2, 1 (blocks of 256, 128, 64 inputs)
    case 4: chunk_offsets<4>(w, x, job.tile, first, b, offset); break;
    case 2: chunk_offsets<2>(w, x, job.tile, first, b, offset); break;
    case 1: chunk_offsets<1>(w, x, job.tile, first, b, offset); break;
    default:
      for (int64_t r = 0; r < CHUNK; r += 4) block_offsets<4, false>(w, x, job.tile, first + r, b, offset + r);
  }
  for (int64_t r = 0; r < CHUNK; r += 4) {
    __m512i dot[4];
    for (int i = 0; i < 4; ++i) {
      const __m512i low = _mm512_load_si512(s.sums[c][0][r + i]), high = _mm512_load_si512(s.sums[c][1][r + i]);
      dot[i] = _mm512_add_epi32(low, _mm512_slli_epi32(high, 8));
    }
    add_block<4>(w, x, job, b, first + r, dot, offset + r);
  }
}

// out += block b's part for rows job.first..job.first+count (a multiple of 16) in tile job.tile, the block
// scaled once for all of them.
template <int BITS>
void tiled_block(const Tiles& w, const Rows& x, const Job& job, int64_t count, int64_t b, ScaledBlock& scaled) {
  const int64_t per_block = w.groups / w.blocks, end = job.first + count;
  BlockSums sums;
  scale_block<BITS>(w, job.tile, b, scaled);
  int64_t first = job.first;
  for (; first + 2 * CHUNK <= end; first += 2 * CHUNK) {
    multiply_block<true>(x, scaled, per_block, b, first, sums);
    add_chunk(w, x, job, b, first, sums, 0);
    add_chunk(w, x, job, b, first + CHUNK, sums, 1);
  }
  if (first < end) {
    multiply_block<false>(x, scaled, per_block, b, first, sums);
    add_chunk(w, x, job, b, first, sums, 0);
  }
}

// Rows job.first..job.first+count (a multiple of 16) of the job's tiles, block by block, within a block tile by tile.
template <int BITS>
void tiled_rows(const Tiles& w, const Rows& x, const Job& job, int64_t count) {
  ScaledBlock scaled;
  configure_tiles();
  for (int64_t b = 0; b < w.blocks; ++b)
    for (int64_t t = 0; t < job.tiles; ++t)
      tiled_block<BITS>(w, x, one_tile(job, t), count, b, scaled);
  _tile_release();
}

template <int BITS>
void tile_rows(const Tiles& w, const Rows& x, const Job& job) {
  const int64_t per_block = w.groups / w.blocks;  // a tile multiply takes two 32-groups of one block
  // a block a ScaledBlock holds, its scales a group's (halves, Q6_K's: the VNNI code)
  const bool tiles_fit = per_block % 2 == 0 && per_block <= MAX_GROUPS && !w.halves;
  const int64_t tiled = job.count < TILED_FROM || !tiles_fit ? 0 : job.count / CHUNK * CHUNK;
  if (tiled) {
    for (int64_t t = 0; t < job.tiles; ++t)
      for (int64_t r = job.first; r < job.first + tiled; ++r)
        _mm512_storeu_ps(job.out + r * job.stride + (job.tile + t) * TILE_ROWS, _mm512_setzero_ps());
    tiled_rows<BITS>(w, x, job, tiled);
  }
  if (job.count == tiled) return;
  for (int64_t t = 0; t < job.tiles; ++t)  // the rows past the last 16 (or all of them, under TILED_FROM)
    tile_avx512_vnni(w, x, {job.tile + t, job.first + tiled, job.count - tiled, job.out, job.stride});
}

}  // namespace

void tile_amx(const Tiles& w, const Rows& x, const Job& job) {
  with_bits(w.bits, [&](auto bits) { tile_rows<decltype(bits)::value>(w, x, job); });
}

}  // namespace q4

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
