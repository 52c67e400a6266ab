// The w4a8 product's data, as every code path of the kernel reads it (q4_path_*.cpp), and the paths'
// entry points. Plain structs and declarations only: the path files are compiled for instruction sets
// this CPU may lack, so they include nothing that defines shared inline code (torch, the standard
// library's templates), which the linker could pick for everyone; the one helper here, ask_ahead, is in an
// anonymous namespace, so each path file keeps its own copy.
//
// Weights [N, K] in tiles of 16 output rows (N padded with zero rows to a multiple of 16), per
// 32-group of inputs (levels L[j][k], j the row in the tile, k the input in the group):
//   qs    uint8 [tiles, K/32, 16·group_bytes]. The group's levels as 8 vectors of 64 bytes, vector q
//         holding L[j][4q..4q+3] at bytes 4j..4j+3 (one int32 lane per output row):
//         4-bit (256 bytes): 4 chunks of 64; chunk c holds vector c in its low nibbles and c+4 in its high.
//         6-bit (384 bytes): the low 4 bits as 4-bit, then 2 chunks of 64 bytes of top bits: chunk e
//                holds the top 2 bits of vector 4e+s at bits 2s..2s+1 (s = 0..3).
//         8-bit (512 bytes): the 8 vectors as they are, a byte a level (0..255: a GGUF's Q8_0 as level q + 128).
//         table (256 bytes; qs int8): 4-bit as above, each an index into IQ4's 16 levels (IQ4_LEVELS: its
//                values + 128, 1..241), so the products are 8-bit levels'.
//   sc    uint8 [tiles, K/32, 16]: each group's scale, in units of its block's d
//   m     uint8 [tiles, K/64, 16, 2]: each group's offset, in units of its block's dmin, groups 2p and
//         2p+1 side by side per row (an int16 pair per lane once widened)
//   d, dmin float16 [tiles, K/block, 16] (Q4_K's own width: its d and dmin are float16 too); a block is 32
//         to 256 inputs: one 32-group (a GGUF's Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: a float16 scale a group, sc 1)
//         or an even number of them
//   w = d·sc·level − dmin·m
//   Blocks of one group may leave out sc ([tiles, K/32, 0]: every scale 1, `unit_scales`), and any tiles dmin
//   ([tiles, blocks, 0]: dmin is d, as a GGUF's Q4_0, Q5_0, Q8_0, IQ4_NL have it): 304 bytes a tile's 4-bit group,
//   not 352, and the AVX-512 path's float steps for such blocks take fewer instructions (q4_path_avx512_vnni.cpp).
// Or, with a scale and an offset per 16 inputs (a GGUF's Q6_K, IQ4_XS: `halves`, sc and m int8, signed):
//   sc    int8 [tiles, K/32, 2, 16]: the scales of each group's first 16 inputs (16 rows), then of its last 16
//   m     int8 [tiles, K/32, 16, 2]: each row's two offsets of the group side by side (an int16 pair per lane)
// Activations [M, K] are int8 levels per row and block (scale amax/127).
//
// What every path computes, for activation row r, output row j and block b (all integer sums exact):
//   dot    = Σ_groups sc_g · Σ_k L[j][k]·x[k]      (int32: at most 8·255·32·255·127 < 2^31)
//   offset = Σ_groups m_g · Σ_k x[k]                 (int32)
//   (halves: the sums run over 16-input halves, each with its own sc and m: |dot| ≤ 16·128·16·255·127 < 2^31)
//   out    = fma(float(dot), d·xs, out);  out = fma(−float(offset), dmin·xs, out)   (blocks in order)
// so every path gives the same bits, and a row's result never depends on the other rows.
#pragma once
#include <cstdint>
#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>
#endif

namespace q4 {

constexpr int64_t GROUP = 32;
constexpr int64_t TILE_ROWS = 16;
constexpr int64_t MAX_BLOCK_GROUPS = 8;  // 32-groups a block holds at most (256 inputs; q4_kernel.cpp checks it)
constexpr int TABLE = 0;  // `bits` of levels stored as 4-bit indices into IQ4_LEVELS (a GGUF's IQ4_NL, IQ4_XS)

// llama.cpp's kvalues_iq4nl + 128: the unsigned levels a table index stands for.
alignas(16) constexpr uint8_t IQ4_LEVELS[16] = {1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241};

// Bytes of one row's 32-group of levels: 4-bit and table 16, 6-bit 24, 8-bit 32.
constexpr int64_t group_bytes(int bits) { return GROUP * (bits == TABLE ? 4 : bits) / 8; }

struct Tiles {
  const uint8_t* qs;
  const uint8_t* sc;
  const uint8_t* m;
  const uint16_t* d;  // float16
  const uint16_t* dmin;
  int64_t groups, blocks;  // per row: K/32 and K/block
  int bits;  // 4, 6, 8 or TABLE
  bool halves = false;  // sc and m int8, one per 16 inputs (layout above)
  bool unit_scales = false;  // every group's sc is 1 (blocks of one group only; no sc stored: sc is null)
};

struct Rows {
  const int8_t* levels;  // [M, K]
  const float* scales;   // [M, K/block]
  const int16_t* sums;   // [M, K/32]: each group's sum of levels (|sum| <= 32·127)
  const int16_t* half_sums;  // [M, K/16]: each 16 inputs' sum of levels
  int64_t width;
  const float* float_sums = nullptr;  // [M, K/32]: sums as floats, where blocks are one group (block 32)
};

// out rows first..first+count, columns tile·16..(tile+tiles)·16−1 (row stride `stride`): W·x of tiles
// tile..tile+tiles−1. Only the amx path takes more than one tile a job (q4_kernel.cpp's Path::tiles_a_job).
struct Job {
  int64_t tile, first, count;
  float* out;
  int64_t stride;
  int64_t tiles = 1;
};

// Tile `tile + t` of a job's run, as a job of its own.
inline Job one_tile(const Job& job, int64_t t) { return {job.tile + t, job.first, job.count, job.out, job.stride}; }

template <int N>
struct Count {
  static constexpr int value = N;
};

template <int R, typename Run>
inline void with_count(int64_t count, Run& run, int64_t first) {
  if constexpr (R > 1) {
    if (count < R) return with_count<R - 1>(count, run, first);
  }
  run(Count<R>{}, first);
}

// run(Count<BITS>{}) for the tiles' levels (4, 6 or 8 bits, or TABLE): a path's code compiled per kind.
template <typename Run>
inline void with_bits(int bits, Run&& run) {
  switch (bits) {
    case 4: return run(Count<4>{});
    case 6: return run(Count<6>{});
    case TABLE: return run(Count<TABLE>{});
    default: return run(Count<8>{});
  }
}

// run(Count<R>{}, first) over the job's rows in chunks of at most MAX, as even as possible (8 rows
// with MAX 5: 4 + 4). Each row's result is the same whatever its chunk.
template <int MAX, typename Run>
inline void in_chunks(const Job& job, Run&& run) {
  const int64_t chunks = (job.count + MAX - 1) / MAX;
  for (int64_t c = 0, first = job.first; c < chunks; ++c) {
    const int64_t count = job.count / chunks + (c < job.count % chunks);
    with_count<MAX>(count, run, first);
    first += count;
  }
}

// One activation row x [width] onto its int8 levels, block by block (scale amax/127, each level
// nearbyint(x · (1/scale)), halfway to even), with each 32-group's and each 16 inputs' sum of levels; `finite` turns false at a NaN or an infinity
// (the block holding it and those after get scale 0). Every version gives the same bits.
struct RowOut {
  int8_t* levels;  // [width]
  float* scales;   // [width / block]
  int16_t* sums;   // [width / 32]
  int16_t* half_sums;  // [width / 16]
};
bool quantize_row_portable(const float* x, int64_t width, int64_t block, const RowOut& out);  // → finite

void tile_portable(const Tiles& w, const Rows& x, const Job& job);

namespace {  // internal linkage, as ask_ahead below

// The two int16 group sums an offset step multiplies with a pair of m (groups g and g+1, g even), as one int32: in
// a block of one 32-group only group g's, in its own half (the pair's other group is the next block's).
inline int32_t sum_pair(const int16_t* sums, int64_t g, int64_t per_block) {
  if (per_block > 1) {
    int32_t quad;
    __builtin_memcpy(&quad, sums + g, 4);
    return quad;
  }
  const uint32_t alone = static_cast<uint16_t>(sums[g]);
  return static_cast<int32_t>(g % 2 ? alone << 16 : alone);
}

// A group's two half sums (halves: the 16-input sums its pair of offsets multiplies), as one int32.
inline int32_t half_pair(const int16_t* half_sums, int64_t g) {
  int32_t pair;
  __builtin_memcpy(&pair, half_sums + 2 * g, 4);
  return pair;
}

// One step of a block's offset sums (q4_tiles.h), at group g of tile `tile`: the 16 rows' m pairs (groups g and g+1
// side by side, or with halves a group's two halves; 32 bytes, uint8 or int8) and the activation sums each pair
// multiplies for activation row `row`. Steps go by 2 groups (by 1 with halves). HALVES: the tiles' (w.halves), known
// when the path's code is compiled, so a step takes no branch.
template <bool HALVES>
inline const uint8_t* step_mins(const Tiles& w, int64_t tile, int64_t g) {
  if constexpr (HALVES) return w.m + (tile * w.groups + g) * 2 * TILE_ROWS;
  return w.m + (tile * w.groups + g - g % 2) * TILE_ROWS;
}
template <bool HALVES>
inline int32_t step_sums(const Tiles& w, const Rows& x, int64_t row, int64_t g) {
  if constexpr (HALVES) return half_pair(x.half_sums + row * 2 * w.groups, g);
  return sum_pair(x.sums + row * w.groups, g, w.groups / w.blocks);
}

}  // namespace

#if defined(__x86_64__) || defined(_M_X64)
namespace {  // internal linkage: each path file compiles its own copy under its own instruction set

// Ask for the `bytes` of weights 4 KB past `qs`, a line at a time, into L2 (prefetcht1), not L1: the hardware's
// prefetcher alone left a verification's rows waiting on memory (5 rows of a target-sized stack of layers on a
// Xeon: 61 ms without, 44 with), and asked into L1 the core's few L1 miss buffers bounded the stream (the bundled
// target's layers, one row 39.3 -> 36.3 ms, five 46.2 -> 44.7 against prefetcht0).
inline void ask_ahead(const uint8_t* qs, int64_t bytes) {
  constexpr int64_t AHEAD = 4096;
  for (int64_t line = 0; line < bytes; line += 64) _mm_prefetch(reinterpret_cast<const char*>(qs + AHEAD + line), _MM_HINT_T1);
}

}  // namespace
bool quantize_row_avx2(const float* x, int64_t width, int64_t block, const RowOut& out);
void tile_avx2(const Tiles& w, const Rows& x, const Job& job);
void tile_avx_vnni(const Tiles& w, const Rows& x, const Job& job);
void tile_avx512_vnni(const Tiles& w, const Rows& x, const Job& job);
void tile_amx(const Tiles& w, const Rows& x, const Job& job);  // AVX-512 VNNI and AMX-INT8, the OS granting the tiles
#endif

}  // namespace q4
