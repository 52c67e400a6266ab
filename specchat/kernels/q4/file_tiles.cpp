// A GGUF's Q4_K, Q5_K, Q6_K, Q4_0, Q4_1, IQ4_NL and Q8_0 blocks as stored → the kernel's tiles (q4_tiles.h), written into
// tensors the caller has placed: what quant/q4_tiles.py's Q4Tiles.from_block(loading/gguf/blocks.py's decoding of
// them) gives, bit for bit (before leaving out a dmin equal to d), with no temporary. A start builds a file's layers
// of those types from the file itself this way, where the stored weights would otherwise hold a second copy of them.
#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "q4_kernel.h"

namespace {

constexpr int64_t kBlockBytes = 144;  // fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles
constexpr int64_t kQ6Bytes = 210;     // 128 bytes of low nibbles, 64 of top 2 bits, 16 int8 scales, fp16 d
constexpr int64_t kGroups = 8;        // 32-input groups a block
constexpr int64_t kTileRows = 16;

void require(bool ok, const std::string& what, const char* function = "tile_q4_k") {
  if (!ok) throw std::invalid_argument(std::string(function) + ": " + what);
}

void require_field(const torch::Tensor& t, const char* name, at::ScalarType type, std::vector<int64_t> shape,
                   const char* function = "tile_q4_k") {
  require(t.scalar_type() == type && t.is_contiguous() && t.sizes().vec() == shape,
          std::string(name) + " must be a contiguous tensor of the tiles' shape and dtype", function);
}

// Group g's (0..7) 6-bit scale and min from a block's 12 scale bytes (llama.cpp's get_scale_min_k4).
inline void scale_and_min(const uint8_t* s, int64_t g, uint8_t& scale, uint8_t& min) {
  if (g < 4) {
    scale = s[g] & 63;
    min = s[g + 4] & 63;
  } else {
    scale = (s[g + 4] & 0xF) | ((s[g - 4] >> 6) << 4);
    min = (s[g + 4] >> 4) | ((s[g] >> 6) << 4);
  }
}

struct Out {
  uint8_t *qs, *sc, *m;
  uint16_t *d, *dmin;
  int64_t groups, blocks;
};

// Where a K block's parts lie: Q4_K's (144 bytes: d, dmin, 12 bytes of scales, 128 of nibbles) or Q5_K's (176: the
// same with 32 bytes of fifth bits before the nibbles: byte i, bit k, level i of the block's group k).
struct KType {
  int64_t bytes, nibbles_at, width;  // a block's bytes, where its nibbles start, a group's bytes in the tile
  bool fifth_bits;
};
constexpr KType kQ4K{kBlockBytes, 16, 16 * kTileRows, false};
constexpr KType kQ5K{176, 48, 24 * kTileRows, true};

// Row j of tile t from its stored bytes (nullptr: a padding row, all zero).
void put_row(const Out& out, const KType& type, int64_t t, int64_t j, const uint8_t* row) {
  for (int64_t b = 0; b < out.blocks; ++b) {
    const uint8_t* block = row ? row + b * type.bytes : nullptr;
    uint16_t d = 0, dmin = 0;
    if (block) {
      std::memcpy(&d, block, 2);
      std::memcpy(&dmin, block + 2, 2);
    }
    out.d[(t * out.blocks + b) * kTileRows + j] = d;
    out.dmin[(t * out.blocks + b) * kTileRows + j] = dmin;
    for (int64_t k = 0; k < kGroups; ++k) {
      const int64_t g = b * kGroups + k;
      uint8_t scale = 0, min = 0;
      if (block) scale_and_min(block + 4, k, scale, min);
      out.sc[(t * out.groups + g) * kTileRows + j] = scale;
      out.m[(t * (out.groups / 2) + g / 2) * 2 * kTileRows + 2 * j + g % 2] = min;
    }
    for (int64_t chunk = 0; chunk < 4; ++chunk) {  // 64 inputs: groups 2p (low nibbles) and 2p + 1 (high)
      const int64_t first = (b * 4 + chunk) * 2;
      const uint8_t* bytes = block ? block + type.nibbles_at + chunk * 32 : nullptr;
      uint8_t* low = out.qs + (t * out.groups + first) * type.width + 4 * j;
      uint8_t* high = low + type.width;
      for (int64_t c = 0; c < 4; ++c) {  // four levels at a time, a byte each
        uint32_t a = 0, z = 0;
        if (bytes) {
          std::memcpy(&a, bytes + 4 * c, 4);
          std::memcpy(&z, bytes + 16 + 4 * c, 4);
        }
        const uint32_t lows = (a & 0x0F0F0F0Fu) | ((z & 0x0F0F0F0Fu) << 4);  // levels 4c + i, 16 + 4c + i of 2p
        const uint32_t highs = ((a >> 4) & 0x0F0F0F0Fu) | (z & 0xF0F0F0F0u);  // the same of group 2p + 1
        std::memcpy(low + c * 64, &lows, 4);
        std::memcpy(high + c * 64, &highs, 4);
      }
    }
    if (!type.fifth_bits) continue;
    for (int64_t k = 0; k < kGroups; ++k) {  // top chunk e: levels 16e + 4u + i's fifth bit at bit 2u, u = 0..3
      uint8_t* tops = out.qs + (t * out.groups + b * kGroups + k) * type.width + 256 + 4 * j;
      for (int64_t e = 0; e < 2; ++e) {
        uint32_t word = 0;
        for (int64_t u = 0; u < 4 && block; ++u) {
          uint32_t bits;
          std::memcpy(&bits, block + 16 + 16 * e + 4 * u, 4);
          word |= ((bits >> k) & 0x01010101u) << (2 * u);
        }
        std::memcpy(tops + e * 64, &word, 4);
      }
    }
  }
}

}  // namespace

void tile_q4_k(torch::Tensor raw, bool fifth_bits, torch::Tensor qs, torch::Tensor sc, torch::Tensor m,
               torch::Tensor d, torch::Tensor dmin) {
  const KType& type = fifth_bits ? kQ5K : kQ4K;
  require(raw.dim() == 2 && raw.scalar_type() == torch::kByte && raw.is_contiguous(),
          "raw must be contiguous uint8 [rows, blocks·bytes]");
  require(raw.size(1) > 0 && raw.size(1) % type.bytes == 0,
          fifth_bits ? "a row must be whole Q5_K blocks of 176 bytes" : "a row must be whole Q4_K blocks of 144 bytes");
  const int64_t rows = raw.size(0), blocks = raw.size(1) / type.bytes, groups = blocks * kGroups;
  const int64_t tiles = (rows + kTileRows - 1) / kTileRows;
  require_field(qs, "qs", torch::kByte, {tiles, groups, type.width});
  require_field(sc, "sc", torch::kByte, {tiles, groups, kTileRows});
  require_field(m, "m", torch::kByte, {tiles, groups / 2, 2 * kTileRows});
  require_field(d, "d", torch::kHalf, {tiles, blocks, kTileRows});
  require_field(dmin, "dmin", torch::kHalf, {tiles, blocks, kTileRows});
  const Out out{qs.data_ptr<uint8_t>(),
                sc.data_ptr<uint8_t>(),
                m.data_ptr<uint8_t>(),
                reinterpret_cast<uint16_t*>(d.data_ptr()),
                reinterpret_cast<uint16_t*>(dmin.data_ptr()),
                groups,
                blocks};
  const uint8_t* bytes = raw.data_ptr<uint8_t>();
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t j = 0; j < kTileRows; ++j) {
        const int64_t row = t * kTileRows + j;
        put_row(out, type, t, j, row < rows ? bytes + row * raw.size(1) : nullptr);
      }
    }
  });
}

namespace {

inline uint32_t word_at(const uint8_t* bytes) {
  uint32_t word;
  std::memcpy(&word, bytes, 4);
  return word;
}

// Row j of tile t of Q6_K blocks (nullptr: a padding row, all zero). Level i of 32-group k of a block (k = 4h + s):
// the low (s < 2) or high nibble of ql byte 64h + 32(s % 2) + i, and bits 2s, 2s + 1 of qh byte 32h + i, on top;
// tiled as q4_tiles.h's 6-bit qs, four levels a word. Each 16's int8 scale goes to sc (a group's first 16's then
// its last's) and m (side by side); d is the block's, dmin 32·d.
void put_q6_row(const Out& out, int64_t t, int64_t j, const uint8_t* row) {
  constexpr int64_t kQs = 24 * kTileRows;  // bytes a group's 16 rows take: 256 of nibbles, 128 of top bits
  for (int64_t b = 0; b < out.blocks; ++b) {
    const uint8_t* block = row ? row + b * kQ6Bytes : nullptr;
    uint16_t d = 0;
    if (block) std::memcpy(&d, block + 208, 2);
    c10::Half half_d;
    half_d.x = d;
    const c10::Half half_dmin(static_cast<float>(half_d) * 32.0f);
    out.d[(t * out.blocks + b) * kTileRows + j] = d;
    out.dmin[(t * out.blocks + b) * kTileRows + j] = half_dmin.x;
    for (int64_t k = 0; k < kGroups; ++k) {
      const int64_t g = b * kGroups + k, h = k / 4, s = k % 4;
      for (int64_t half = 0; half < 2; ++half) {
        const uint8_t scale = block ? block[192 + 2 * k + half] : 0;  // the int8 scale's bits
        out.sc[(t * out.groups + g) * 2 * kTileRows + half * kTileRows + j] = scale;
        out.m[(t * out.groups + g) * 2 * kTileRows + 2 * j + half] = scale;
      }
      uint8_t* qs = out.qs + (t * out.groups + g) * kQs + 4 * j;
      const uint8_t* low = block ? block + 64 * h + 32 * (s % 2) : nullptr;
      const uint8_t* top = block ? block + 128 + 32 * h : nullptr;
      for (int64_t c = 0; c < 4; ++c) {  // levels 4c + i (low nibble) and 16 + 4c + i (high), i = 0..3
        const uint32_t a = low ? word_at(low + 4 * c) : 0, z = low ? word_at(low + 16 + 4 * c) : 0;
        const uint32_t nibbles = s < 2 ? (a & 0x0F0F0F0Fu) | ((z & 0x0F0F0F0Fu) << 4)
                                       : ((a >> 4) & 0x0F0F0F0Fu) | (z & 0xF0F0F0F0u);
        std::memcpy(qs + c * 64, &nibbles, 4);
      }
      for (int64_t e = 0; e < 2; ++e) {  // top chunk e: levels 16e + 4u + i's top bits at bits 2u, u = 0..3
        uint32_t tops = 0;
        for (int64_t u = 0; u < 4 && top; ++u) {
          tops |= ((word_at(top + 16 * e + 4 * u) >> (2 * s)) & 0x03030303u) << (2 * u);
        }
        std::memcpy(qs + 256 + e * 64, &tops, 4);
      }
    }
  }
}

}  // namespace

void tile_q6_k(torch::Tensor raw, torch::Tensor qs, torch::Tensor sc, torch::Tensor m, torch::Tensor d,
               torch::Tensor dmin) {
  const char* self = "tile_q6_k";
  require(raw.dim() == 2 && raw.scalar_type() == torch::kByte && raw.is_contiguous(),
          "raw must be contiguous uint8 [rows, blocks·210]", self);
  require(raw.size(1) > 0 && raw.size(1) % kQ6Bytes == 0, "a row must be whole Q6_K blocks of 210 bytes", self);
  const int64_t rows = raw.size(0), blocks = raw.size(1) / kQ6Bytes, groups = blocks * kGroups;
  const int64_t tiles = (rows + kTileRows - 1) / kTileRows;
  require_field(qs, "qs", torch::kByte, {tiles, groups, 24 * kTileRows}, self);
  require_field(sc, "sc", torch::kChar, {tiles, groups, 2 * kTileRows}, self);
  require_field(m, "m", torch::kChar, {tiles, groups, 2 * kTileRows}, self);
  require_field(d, "d", torch::kHalf, {tiles, blocks, kTileRows}, self);
  require_field(dmin, "dmin", torch::kHalf, {tiles, blocks, kTileRows}, self);
  const Out out{qs.data_ptr<uint8_t>(),
                reinterpret_cast<uint8_t*>(sc.data_ptr()),
                reinterpret_cast<uint8_t*>(m.data_ptr()),
                reinterpret_cast<uint16_t*>(d.data_ptr()),
                reinterpret_cast<uint16_t*>(dmin.data_ptr()),
                groups,
                blocks};
  const uint8_t* bytes = raw.data_ptr<uint8_t>();
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t j = 0; j < kTileRows; ++j) {
        const int64_t row = t * kTileRows + j;
        put_q6_row(out, t, j, row < rows ? bytes + row * raw.size(1) : nullptr);
      }
    }
  });
}

namespace {

// The one-group types tiled from the file: bytes a 32-group, where its levels start, the offset level m, whether a
// level is a byte (Q8_0) or a nibble, and whether the block carries a min (Q4_1: dmin = −min).
struct GroupType {
  int64_t bytes, levels_at;
  uint8_t m;
  bool byte_levels, with_min;
};
constexpr GroupType kGroupTypes[] = {
    {18, 2, 8, false, false},   // 0: Q4_0, w = d·(q − 8)
    {20, 4, 1, false, true},    // 1: Q4_1, w = d·q + min
    {18, 2, 128, false, false},  // 2: IQ4_NL, table indices (the kernel looks each level up), offset d·128
    {34, 2, 128, true, false},  // 3: Q8_0, levels q + 128, offset d·128
};

// Row j of tile t of one-group blocks (nullptr: a padding row, all zero). A nibble type's group bytes are the tile's
// bytes as they are (byte i: level i low, 16 + i high; the tile's byte 64c + 4j + i holds levels 4c + i and
// 16 + 4c + i); Q8_0's 32 int8 levels go four a vector, + 128. sc is left out (every scale 1) and dmin too, but Q4_1's.
void put_group_row(const Out& out, const GroupType& type, int64_t t, int64_t j, const uint8_t* row) {
  const int64_t width = (type.byte_levels ? 32 : 16) * kTileRows;  // a group's bytes in the tile
  for (int64_t g = 0; g < out.groups; ++g) {
    const uint8_t* block = row ? row + g * type.bytes : nullptr;
    uint16_t d = 0, min = 0;
    if (block) std::memcpy(&d, block, 2);
    if (block && type.with_min) std::memcpy(&min, block + 2, 2);
    out.d[(t * out.groups + g) * kTileRows + j] = d;
    if (type.with_min) out.dmin[(t * out.groups + g) * kTileRows + j] = block ? min ^ 0x8000u : 0;  // −min, exactly
    out.m[(t * (out.groups / 2) + g / 2) * 2 * kTileRows + 2 * j + g % 2] = block ? type.m : 0;
    uint8_t* qs = out.qs + (t * out.groups + g) * width + 4 * j;
    const int64_t words = type.byte_levels ? 8 : 4;
    for (int64_t c = 0; c < words; ++c) {
      uint32_t word = block ? word_at(block + type.levels_at + 4 * c) : 0;
      if (block && type.byte_levels) word ^= 0x80808080u;  // int8 q + 128, byte by byte
      std::memcpy(qs + c * 64, &word, 4);
    }
  }
}

}  // namespace

void tile_group_blocks(torch::Tensor raw, int64_t kind, torch::Tensor qs, torch::Tensor m, torch::Tensor d,
                       torch::Tensor dmin) {
  const char* self = "tile_group_blocks";
  require(kind >= 0 && kind < 4, "kind must be 0 (Q4_0), 1 (Q4_1), 2 (IQ4_NL) or 3 (Q8_0)", self);
  const GroupType& type = kGroupTypes[kind];
  require(raw.dim() == 2 && raw.scalar_type() == torch::kByte && raw.is_contiguous(),
          "raw must be contiguous uint8 [rows, groups·bytes]", self);
  require(raw.size(1) > 0 && raw.size(1) % (2 * type.bytes) == 0, "a row must be an even number of whole blocks", self);
  const int64_t rows = raw.size(0), groups = raw.size(1) / type.bytes;
  const int64_t tiles = (rows + kTileRows - 1) / kTileRows;
  require(qs.scalar_type() == torch::kByte || qs.scalar_type() == torch::kChar, "qs must be uint8 or int8", self);
  require(qs.is_contiguous() && qs.sizes().vec() == std::vector<int64_t>{tiles, groups, (type.byte_levels ? 32 : 16) * kTileRows},
          "qs must be a contiguous tensor of the tiles' shape", self);
  require_field(m, "m", torch::kByte, {tiles, groups / 2, 2 * kTileRows}, self);
  require_field(d, "d", torch::kHalf, {tiles, groups, kTileRows}, self);
  require_field(dmin, "dmin", torch::kHalf, {tiles, groups, type.with_min ? kTileRows : 0}, self);
  const Out out{reinterpret_cast<uint8_t*>(qs.data_ptr()),
                nullptr,
                m.data_ptr<uint8_t>(),
                reinterpret_cast<uint16_t*>(d.data_ptr()),
                reinterpret_cast<uint16_t*>(dmin.data_ptr()),
                groups,
                groups};
  const uint8_t* bytes = raw.data_ptr<uint8_t>();
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t j = 0; j < kTileRows; ++j) {
        const int64_t row = t * kTileRows + j;
        put_group_row(out, type, t, j, row < rows ? bytes + row * raw.size(1) : nullptr);
      }
    }
  });
}
