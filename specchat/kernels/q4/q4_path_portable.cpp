// The w4a8 product in plain C++ (no intrinsics): it builds on any CPU, and every other path must give
// its bits (layout and arithmetic: q4_tiles.h).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "../simd.h"  // half_to_float: a scalar function, compiled with this file's plain flags
#include "q4_tiles.h"

namespace q4 {
namespace {

// One tile's group of levels as 8 vectors of 64 bytes: vector q holds L[j][4q + t] at byte 4j + t.
void unpack(const uint8_t* qs, int bits, uint8_t vectors[8][64]) {
  if (bits == 8) {
    std::memcpy(vectors, qs, 8 * 64);
    return;
  }
  for (int c = 0; c < 4; ++c)
    for (int i = 0; i < 64; ++i) {
      vectors[c][i] = qs[c * 64 + i] & 0x0F;
      vectors[c + 4][i] = qs[c * 64 + i] >> 4;
    }
  if (bits == 6)
    for (int q = 0; q < 8; ++q)
      for (int i = 0; i < 64; ++i) vectors[q][i] |= ((qs[256 + (q / 4) * 64 + i] >> (2 * (q % 4))) & 3) << 4;
  if (bits == TABLE)
    for (int q = 0; q < 8; ++q)
      for (int i = 0; i < 64; ++i) vectors[q][i] = IQ4_LEVELS[vectors[q][i]];
}

// Row j of group g (at: its index among the tiles' groups) into a row's sums: its Σ L·x times its scale, its
// offset times the activations' sum; m holds pairs of groups side by side per row.
void add_group(const Tiles& w, int32_t sum, int64_t at, int64_t g, int j, int32_t products, int32_t& dot, int32_t& offset) {
  dot += w.unit_scales ? products : products * w.sc[at * TILE_ROWS + j];
  offset += w.m[(at - g % 2) * TILE_ROWS + g % 2 + 2 * j] * sum;
}

// The same with a signed scale and offset per 16 inputs (halves: q4_tiles.h); half_sums: the group's two.
void add_halves(const Tiles& w, const int16_t* half_sums, int64_t at, int j, const int32_t products[2], int32_t& dot,
                int32_t& offset) {
  const auto* sc = reinterpret_cast<const int8_t*>(w.sc) + at * 2 * TILE_ROWS;
  const auto* m = reinterpret_cast<const int8_t*>(w.m) + at * 2 * TILE_ROWS;
  for (int h = 0; h < 2; ++h) {
    dot += products[h] * sc[h * TILE_ROWS + j];
    offset += m[2 * j + h] * half_sums[h];
  }
}

// Block b of rows first..first+count: their dot and offset sums [count][16] for the tile's rows.
void block_sums(const Tiles& w, const Rows& x, const Job& job, int64_t b, int32_t (*dot)[TILE_ROWS],
                int32_t (*offset)[TILE_ROWS]) {
  const int64_t per_block = w.groups / w.blocks;
  uint8_t vectors[8][64];
  for (int64_t r = 0; r < job.count; ++r)
    for (int j = 0; j < TILE_ROWS; ++j) dot[r][j] = offset[r][j] = 0;
  for (int64_t g = b * per_block; g < (b + 1) * per_block; ++g) {
    const int64_t at = job.tile * w.groups + g;
    unpack(w.qs + at * TILE_ROWS * group_bytes(w.bits), w.bits, vectors);
    for (int64_t r = 0; r < job.count; ++r) {
      const int8_t* activations = x.levels + (job.first + r) * x.width + g * GROUP;
      for (int j = 0; j < TILE_ROWS; ++j) {
        int32_t products[2] = {0, 0};  // inputs 0-15 (vectors 0-3), 16-31 (vectors 4-7)
        for (int q = 0; q < 8; ++q)
          for (int t = 0; t < 4; ++t) products[q / 4] += vectors[q][4 * j + t] * activations[4 * q + t];
        if (w.halves)
          add_halves(w, x.half_sums + (job.first + r) * 2 * w.groups + 2 * g, at, j, products, dot[r][j], offset[r][j]);
        else
          add_group(w, x.sums[(job.first + r) * w.groups + g], at, g, j, products[0] + products[1], dot[r][j], offset[r][j]);
      }
    }
  }
}

}  // namespace

bool quantize_row_portable(const float* x, int64_t width, int64_t block, const RowOut& out) {
  bool finite = true;
  for (int64_t b = 0; b < width / block; ++b) {
    const float* in = x + b * block;
    float amax = 0.f;
    for (int64_t i = 0; i < block; ++i) {
      finite = finite && std::isfinite(in[i]);
      amax = std::fmax(amax, std::fabs(in[i]));
    }
    const float scale = finite ? amax / 127.f : 0.f;
    const float inverse = scale > 0.f ? 1.f / scale : 0.f;
    out.scales[b] = scale;
    for (int64_t g = b * block / GROUP; g < (b + 1) * block / GROUP; ++g) {
      int32_t sums[2] = {0, 0};
      for (int64_t i = g * GROUP; i < (g + 1) * GROUP; ++i) {
        out.levels[i] = static_cast<int8_t>(std::nearbyint(x[i] * inverse));
        sums[(i - g * GROUP) / 16] += out.levels[i];
      }
      out.half_sums[2 * g] = static_cast<int16_t>(sums[0]);
      out.half_sums[2 * g + 1] = static_cast<int16_t>(sums[1]);
      out.sums[g] = static_cast<int16_t>(sums[0] + sums[1]);
    }
  }
  return finite;
}

void tile_portable(const Tiles& w, const Rows& x, const Job& job) {
  std::vector<int32_t> sums(2 * job.count * TILE_ROWS);
  auto* dot = reinterpret_cast<int32_t (*)[TILE_ROWS]>(sums.data());
  auto* offset = dot + job.count;
  for (int64_t r = 0; r < job.count; ++r)
    for (int j = 0; j < TILE_ROWS; ++j) job.out[(job.first + r) * job.stride + job.tile * TILE_ROWS + j] = 0.f;
  for (int64_t b = 0; b < w.blocks; ++b) {
    block_sums(w, x, job, b, dot, offset);
    const uint16_t* d = w.d + (job.tile * w.blocks + b) * TILE_ROWS;
    const uint16_t* dmin = w.dmin + (job.tile * w.blocks + b) * TILE_ROWS;
    for (int64_t r = 0; r < job.count; ++r) {
      const float scale = x.scales[(job.first + r) * w.blocks + b];
      float* out = job.out + (job.first + r) * job.stride + job.tile * TILE_ROWS;
      for (int j = 0; j < TILE_ROWS; ++j) {
        out[j] = std::fma(static_cast<float>(dot[r][j]), simd::half_to_float(d[j]) * scale, out[j]);
        out[j] = std::fma(-static_cast<float>(offset[r][j]), simd::half_to_float(dmin[j]) * scale, out[j]);
      }
    }
  }
}

}  // namespace q4
