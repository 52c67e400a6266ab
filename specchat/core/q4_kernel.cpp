// 4-bit weights × 8-bit activations on AVX2, batch-invariant: a row's result never depends on the
// other rows fed with it (integer dot products are exact, and every row takes the same float steps
// in the same order whatever the batch).
//
// Weights [N, K], per output row n, in blocks of B = 256 inputs where K allows, else 128:
//   qs    uint8 [N, K/2]   4-bit levels 0..15, two a byte: byte i of a 64-chunk holds level i of its first
//                          32-group (low nibble) and level i of the second (high nibble);
//         or uint8 [N, 3K/4] 6-bit levels 0..63 (layers kept finer than 4 bits), 48 bytes a 64-chunk: their
//                          low 4 bits as above in 32 bytes, then 16 bytes of their top 2 bits, byte i holding
//                          those of level i + 16 of the second group (bits 2-3), level i of the second (bits
//                          0-1), level i + 16 of the first (bits 6-7) and level i of the first (bits 4-5);
//         or uint8 [N, K]  one level a byte, levels 0..127 (7-bit)
//   sc, m uint8 [N, K/32]  each 32-group's scale and offset, in units of its block's d and dmin
//   d, dmin float [N, K/B]
//   w = d·sc·level − dmin·m
// Activations x [M, K] float32 are mapped per row and per block onto int8 (scale amax/127), as
// llama.cpp's Q8 blocks do, so an outlier channel costs precision only inside its own block.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "simd.h"

namespace {

constexpr int64_t GROUP = 32;
constexpr int TILE = 5;  // most activation rows multiplied per pass over a weight row (a γ-4 verification)
constexpr int64_t PREFETCH_BYTES = 2048;  // how far ahead of its reads a one- or two-row pass asks for weights

// Block-major, so that a tile's rows sit at fixed offsets from one pointer per block (row r of
// block b at (b·M + r)·B): with a pointer per row and array, five rows spilled the pointers.
struct Activations {
  int64_t rows, width, block;
  std::vector<int8_t> levels;   // [K/B, M, B]
  std::vector<float> scales;    // [K/B, M]
  std::vector<float> sums;      // [K/B, M, B/32]: each 32-group's sum of levels times its block's scale
};

// Row r of x onto its int8 levels, block by block.
void quantize_row(const float* in, int64_t r, Activations& a) {
  const int64_t per_block = a.block / GROUP;
  for (int64_t b = 0; b < a.width / a.block; ++b) {
    const float* x = in + b * a.block;
    int8_t* levels = a.levels.data() + (b * a.rows + r) * a.block;
    float* sums = a.sums.data() + (b * a.rows + r) * per_block;
    float amax = 0.f;
    for (int64_t i = 0; i < a.block; ++i) amax = std::fmax(amax, std::fabs(x[i]));
    const float scale = amax / 127.f;
    const float inverse = scale > 0.f ? 1.f / scale : 0.f;
    a.scales[b * a.rows + r] = scale;
    for (int64_t g = 0; g < per_block; ++g) {
      int32_t sum = 0;
      for (int64_t i = g * GROUP; i < (g + 1) * GROUP; ++i) {
        const int32_t level = static_cast<int32_t>(std::nearbyint(x[i] * inverse));
        levels[i] = static_cast<int8_t>(level);
        sum += level;
      }
      sums[g] = scale * static_cast<float>(sum);
    }
  }
}

Activations quantize_rows(const float* x, int64_t rows, int64_t width, int64_t block) {
  Activations a{rows, width, block, std::vector<int8_t>(rows * width), std::vector<float>(rows * (width / block)),
                std::vector<float>(rows * (width / GROUP))};
  for (int64_t r = 0; r < rows; ++r) quantize_row(x + r * width, r, a);
  return a;
}

struct WeightRow {
  const uint8_t* qs; const uint8_t* sc; const uint8_t* m; const float* d; const float* dmin;
};

inline __m256i group_product(__m256i levels, const int8_t* acts, __m256i scale) {
  const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(acts));
  return _mm256_madd_epi16(_mm256_maddubs_epi16(levels, a), scale);
}

// G groups' dmin·m as floats (the low lanes when G = 4), and their activation sums likewise.
template <int G>
inline __m256 load_groups(const float* sums) {
  if constexpr (G == 8) return _mm256_loadu_ps(sums);
  else return _mm256_zextps128_ps256(_mm_loadu_ps(sums));
}

template <int G>
inline __m256 group_offsets(const uint8_t* m, float dmin) {
  if constexpr (G == 8) {
    const __m256i m8 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(m)));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(m8), _mm256_set1_ps(dmin));
  } else {
    const __m128i m4 = _mm_cvtepu8_epi32(_mm_cvtsi32_si128(*reinterpret_cast<const int32_t*>(m)));
    return _mm256_zextps128_ps256(_mm_mul_ps(_mm_cvtepi32_ps(m4), _mm_set1_ps(dmin)));
  }
}

// The bytes of one 32-group's levels: 4-bit 16, 6-bit 24, 7-bit 32 (a byte each).
constexpr int64_t group_bytes(int bits) { return bits == 7 ? GROUP : GROUP * bits / 8; }

// Two 32-groups' levels: from 32 bytes of nibbles, 48 bytes of 6-bit levels or 64 bytes of 7-bit ones.
template <int BITS>
inline void load_levels(const uint8_t* qs, int64_t group, __m256i& first, __m256i& second) {
  if constexpr (BITS == 7) {  // |pair| <= 2*127*127 < 2^15: maddubs never saturates
    first = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + group * GROUP));
    second = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + (group + 1) * GROUP));
    return;
  }
  const __m256i low_nibbles = _mm256_set1_epi8(0x0F);
  const uint8_t* chunk = qs + group * group_bytes(BITS);
  const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk));
  first = _mm256_and_si256(packed, low_nibbles);
  second = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low_nibbles);
  if constexpr (BITS == 6) {  // levels <= 63, so |pair| <= 2*63*127 < 2^15. Each level's top 2 bits
    // go to bits 4-5 of its byte (the 64-bit shifts carry bits across bytes; the mask drops those)
    const __m256i top = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(chunk + 32)));
    const __m256i bits_4_5 = _mm256_set1_epi8(0x30);
    first = _mm256_or_si256(first, _mm256_and_si256(_mm256_srlv_epi64(top, _mm256_set_epi64x(2, 2, 0, 0)), bits_4_5));
    second = _mm256_or_si256(second, _mm256_and_si256(_mm256_sllv_epi64(top, _mm256_set_epi64x(2, 2, 4, 4)), bits_4_5));
  }
}

// The G 32-groups' scales of one block as int16, in both 128-bit lanes (G = 4 or 8).
template <int G>
inline __m256i block_scales(const uint8_t* sc) {
  const __m128i bytes = G == 8 ? _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc))
                               : _mm_cvtsi32_si128(*reinterpret_cast<const int32_t*>(sc));
  return _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(bytes));
}

// Byte-shuffle controls: SCALE_PICKS[g] copies int16 lane g of a 128-bit lane into all its lanes.
struct ScalePicks {
  alignas(32) int16_t lanes[8][16];
  constexpr ScalePicks() : lanes{} {
    for (int g = 0; g < 8; ++g)
      for (int i = 0; i < 16; ++i) lanes[g][i] = static_cast<int16_t>(((2 * g + 1) << 8) | (2 * g));
  }
};
constexpr ScalePicks SCALE_PICKS;

// Group g's scale in every int16 lane, picked from block_scales by one byte shuffle.
inline __m256i scale_of(__m256i scales, int g) {
  return _mm256_shuffle_epi8(scales, _mm256_load_si256(reinterpret_cast<const __m256i*>(SCALE_PICKS.lanes[g])));
}

// One pair of 32-groups (group, group + 1) times the R rows of a tile, added to their block sums;
// `acts` points at the pair's activations in the tile's first row, the others follow a block apart.
template <int R, int G, int BITS>
inline void pair_products(const uint8_t* qs, int64_t group, __m256i scales, int pair, const int8_t* acts,
                          __m256i* block_sum) {
  __m256i first, second;
  load_levels<BITS>(qs, group, first, second);
  const __m256i scale_1 = scale_of(scales, 2 * pair), scale_2 = scale_of(scales, 2 * pair + 1);
  for (int r = 0; r < R; ++r) {
    const int8_t* row = acts + r * G * GROUP;
    block_sum[r] = _mm256_add_epi32(block_sum[r], group_product(first, row, scale_1));
    block_sum[r] = _mm256_add_epi32(block_sum[r], group_product(second, row + GROUP, scale_2));
  }
}

// Block b's integer sums for the R rows (acts: the block's activations in the tile's first row).
// With one or two rows the loop waits on memory, so it asks for the weights PREFETCH_BYTES ahead
// (the hardware prefetcher alone kept about 16 of 25 GB/s); with more it waits on the multipliers,
// and the rolled loop measured faster.
template <int R, int G, int BITS>
inline void block_products(const WeightRow& w, int64_t b, const int8_t* acts, __m256i* block_sum) {
  const __m256i scales = block_scales<G>(w.sc + b * G);
  if constexpr (R <= 2) {
    constexpr int64_t PAIR_BYTES = 2 * group_bytes(BITS), LINE = 64;
#pragma GCC unroll 4
    for (int pair = 0; pair < G / 2; ++pair) {
      const int64_t group = b * G + 2 * pair;
      if (PAIR_BYTES % LINE != 0 || (pair * PAIR_BYTES) % LINE == 0)  // once per cache line (6-bit: each pair)
        _mm_prefetch(reinterpret_cast<const char*>(w.qs + group * group_bytes(BITS) + PREFETCH_BYTES), _MM_HINT_T0);
      pair_products<R, G, BITS>(w.qs, group, scales, pair, acts + 2 * pair * GROUP, block_sum);
    }
  } else {
#pragma GCC unroll 1
    for (int pair = 0; pair < G / 2; ++pair)
      pair_products<R, G, BITS>(w.qs, b * G + 2 * pair, scales, pair, acts + 2 * pair * GROUP, block_sum);
  }
}

// out[r] = W[n] . x[r] for the R rows of one tile, G 32-groups a block. Each weight pair of groups
// is unpacked and scaled once for all R rows; each row's integer sums are exact and its float steps
// the same whatever R is.
template <int R, int G, int BITS>
void dot_tile(const WeightRow& w, const Activations& a, int64_t first_row, float* out) {
  constexpr int64_t BLOCK = G * GROUP;
  const int64_t blocks = a.width / BLOCK;
  __m256 total[R];
  for (int r = 0; r < R; ++r) total[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t tile = b * a.rows + first_row;  // the tile's first row in block b
    __m256i block_sum[R];
    for (int r = 0; r < R; ++r) block_sum[r] = _mm256_setzero_si256();
    block_products<R, G, BITS>(w, b, a.levels.data() + tile * BLOCK, block_sum);
    const __m256 mins = group_offsets<G>(w.m + b * G, w.dmin[b]);
    const float* sums = a.sums.data() + tile * G;
    const float* scales = a.scales.data() + tile;
    for (int r = 0; r < R; ++r) {
      const __m256 step = _mm256_set1_ps(w.d[b] * scales[r]);
      total[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(block_sum[r]), step, total[r]);
      total[r] = _mm256_fnmadd_ps(load_groups<G>(sums + r * G), mins, total[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = simd::lane_sum(total[r]);
}

// The rows in tiles of at most TILE, as even as possible (8 rows: 4 + 4), since a tile's
// accumulators must fit in registers.
template <int G, int BITS>
void dot_rows(const WeightRow& w, const Activations& a, int64_t rows, float* out, int64_t out_stride) {
  float tile[TILE];
  const int64_t tiles = (rows + TILE - 1) / TILE;
  for (int64_t t = 0, first = 0; t < tiles; ++t) {
    const int64_t count = rows / tiles + (t < rows % tiles);
    switch (count) {
      case 5: dot_tile<5, G, BITS>(w, a, first, tile); break;
      case 4: dot_tile<4, G, BITS>(w, a, first, tile); break;
      case 3: dot_tile<3, G, BITS>(w, a, first, tile); break;
      case 2: dot_tile<2, G, BITS>(w, a, first, tile); break;
      default: dot_tile<1, G, BITS>(w, a, first, tile); break;
    }
    for (int64_t r = 0; r < count; ++r) out[(first + r) * out_stride] = tile[r];
    first += count;
  }
}

// One weight row for every row of x, by level width and block size.
void dot_weight_row(int bits, int64_t block, const WeightRow& w, const Activations& a, int64_t rows, float* out, int64_t stride) {
  const bool wide = block == 256;
  switch (bits) {
    case 4: return wide ? dot_rows<8, 4>(w, a, rows, out, stride) : dot_rows<4, 4>(w, a, rows, out, stride);
    case 6: return wide ? dot_rows<8, 6>(w, a, rows, out, stride) : dot_rows<4, 6>(w, a, rows, out, stride);
    default: return wide ? dot_rows<8, 7>(w, a, rows, out, stride) : dot_rows<4, 7>(w, a, rows, out, stride);
  }
}

}  // namespace

// x [M, K] float32 → W x [M, N] float32; the block size is K / d.size(1) (128 or 256).
torch::Tensor q4_linear(torch::Tensor x, torch::Tensor qs, torch::Tensor sc, torch::Tensor m,
                        torch::Tensor d, torch::Tensor dmin) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32, "x must be float32 [M, K]");
  const int64_t rows = x.size(0), width = x.size(1), outs = qs.size(0);
  const int bits = qs.size(1) * 2 == width ? 4 : qs.size(1) * 4 == width * 3 ? 6 : qs.size(1) == width ? 7 : 0;
  TORCH_CHECK(bits != 0 && d.size(1) > 0 && width % d.size(1) == 0, "x does not match the weights");
  const int64_t block = width / d.size(1);
  TORCH_CHECK(block == 128 || block == 256, "blocks must be 128 or 256 inputs wide");
  for (const auto& t : {qs, sc, m}) TORCH_CHECK(t.scalar_type() == torch::kUInt8 && t.is_contiguous() && t.size(0) == outs,
                                                "qs, sc and m must be contiguous uint8 with a row per output");
  for (const auto& t : {d, dmin}) TORCH_CHECK(t.scalar_type() == torch::kFloat32 && t.is_contiguous() && t.size(0) == outs,
                                              "d and dmin must be contiguous float32 with a row per output");
  TORCH_CHECK(sc.size(1) == width / GROUP && m.size(1) == width / GROUP && dmin.size(1) == d.size(1),
              "sc and m need one value per 32 inputs, dmin as many as d");
  auto input = x.contiguous();
  const Activations a = quantize_rows(input.data_ptr<float>(), rows, width, block);
  auto out = torch::empty({rows, outs}, x.options());
  float* out_data = out.data_ptr<float>();
  const uint8_t* qs_data = qs.data_ptr<uint8_t>();
  const int64_t row_bytes = qs.size(1);
  const uint8_t* sc_data = sc.data_ptr<uint8_t>();
  const uint8_t* m_data = m.data_ptr<uint8_t>();
  const float* d_data = d.data_ptr<float>();
  const float* dmin_data = dmin.data_ptr<float>();
  const int64_t groups = width / GROUP, blocks = width / block;
  at::parallel_for(0, outs, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const WeightRow w{qs_data + n * row_bytes, sc_data + n * groups, m_data + n * groups,
                        d_data + n * blocks, dmin_data + n * blocks};
      float* out_n = out_data + n;
      dot_weight_row(bits, block, w, a, rows, out_n, outs);
    }
  });
  return out;
}

void register_lean_layers(pybind11::module& module);  // lean_layers.cpp

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  register_lean_layers(module);
  module.def("q4_linear", &q4_linear, "4-bit weights x 8-bit activations, batch-invariant (AVX2)",
             pybind11::call_guard<pybind11::gil_scoped_release>());
}
