// A GGUF's Q4_K, Q5_K, Q6_K, IQ4_XS, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL and Q8_0 blocks as stored → the kernel's tiles
// (q4_tiles.h): what quant/q4_tiles.py's Q4Tiles.from_block(loading/gguf/blocks.py's decoding of them) gives, bit for bit (before leaving
// out a dmin equal to d), with no temporary. A start builds a file's layers of those types from the file itself this
// way, where the stored weights would otherwise hold a second copy of them.
#include "file_tiles.h"

#include <cstring>

namespace file_tiles {
namespace {

constexpr int64_t kBlockBytes = 144;  // fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles

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

inline uint32_t word_at(const uint8_t* bytes) {
  uint32_t word;
  std::memcpy(&word, bytes, 4);
  return word;
}

// 2^shift × a float16 (its bits), exactly where the product is one (as 32·d is for every Q6_K block and 128·d for
// every IQ4_XS block the kernel holds as stored); an infinity past the range.
uint16_t times_power_of_two(uint16_t h, int shift) {
  const uint16_t sign = h & 0x8000u, exponent = (h >> 10) & 0x1F, fraction = h & 0x3FF;
  if (exponent == 0x1F || (exponent == 0 && fraction == 0)) return h;
  if (exponent == 0) {  // subnormal: fraction · 2^−24, times 2^shift is fraction · 2^(shift − 24)
    int top = 9;
    while (!(fraction >> top)) --top;
    if (top + shift <= 9) return sign | static_cast<uint16_t>(fraction << shift);  // still subnormal
    return sign | static_cast<uint16_t>((top + shift - 9) << 10) | static_cast<uint16_t>((fraction << (10 - top)) & 0x3FF);
  }
  if (exponent + shift >= 0x1F) return sign | 0x7C00u;
  return sign | static_cast<uint16_t>((exponent + shift) << 10) | fraction;
}

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
    out.d[(t * out.blocks + b) * kTileRows + j] = d;
    out.dmin[(t * out.blocks + b) * kTileRows + j] = times_power_of_two(d, 5);
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

// Row j of tile t of IQ4_XS blocks (nullptr: a padding row, all zero): fp16 d, the 32-groups' 6-bit scales (the low
// nibble g of bytes 4..7, the top 2 bits at 2g of the uint16 at byte 2, less 32), then each group's 16 bytes of
// table indices as IQ4_NL's (the tile's bytes as they are). Each group's signed scale goes to both its halves' sc and
// m (as Q6_K's), d is the block's and dmin 128·d.
void put_iq4_xs_row(const Out& out, int64_t t, int64_t j, const uint8_t* row) {
  constexpr int64_t kQs = 16 * kTileRows;  // bytes a group's 16 rows take
  for (int64_t b = 0; b < out.blocks; ++b) {
    const uint8_t* block = row ? row + b * kIQ4XSBytes : nullptr;
    uint16_t d = 0, tops = 0;
    if (block) {
      std::memcpy(&d, block, 2);
      std::memcpy(&tops, block + 2, 2);
    }
    out.d[(t * out.blocks + b) * kTileRows + j] = d;
    out.dmin[(t * out.blocks + b) * kTileRows + j] = times_power_of_two(d, 7);
    for (int64_t k = 0; k < kGroups; ++k) {
      const int64_t g = b * kGroups + k;
      const int low = block ? (block[4 + k / 2] >> (4 * (k % 2))) & 0x0F : 0;
      const int high = (tops >> (2 * k)) & 3;
      const uint8_t scale = block ? static_cast<uint8_t>((low | (high << 4)) - 32) : 0;  // the int8 scale's bits
      for (int64_t half = 0; half < 2; ++half) {
        out.sc[(t * out.groups + g) * 2 * kTileRows + half * kTileRows + j] = scale;
        out.m[(t * out.groups + g) * 2 * kTileRows + 2 * j + half] = scale;
      }
      uint8_t* qs = out.qs + (t * out.groups + g) * kQs + 4 * j;
      for (int64_t c = 0; c < 4; ++c) {
        const uint32_t word = block ? word_at(block + 8 + 16 * k + 4 * c) : 0;
        std::memcpy(qs + c * 64, &word, 4);
      }
    }
  }
}

// The one-group types tiled from the file: bytes a 32-group, where its levels start, the offset level m, whether a
// level is a byte (Q8_0) or a nibble, whether the block carries a min (Q4_1, Q5_1: dmin = −min), and where its fifth
// bits lie (Q5_0, Q5_1: a 32-bit word, bit i level i's; 0: none).
struct GroupType {
  int64_t bytes, levels_at;
  uint8_t m;
  bool byte_levels, with_min;
  int64_t fifth_bits_at;
};
constexpr GroupType kGroupTypes[] = {
    {18, 2, 8, false, false, 0},    // 0: Q4_0, w = d·(q − 8)
    {20, 4, 1, false, true, 0},     // 1: Q4_1, w = d·q + min
    {18, 2, 128, false, false, 0},  // 2: IQ4_NL, table indices (the kernel looks each level up), offset d·128
    {34, 2, 128, true, false, 0},   // 3: Q8_0, levels q + 128, offset d·128
    {22, 6, 16, false, false, 2},   // 4: Q5_0, w = d·(q − 16), 6-bit levels
    {24, 8, 1, false, true, 4},     // 5: Q5_1, w = d·q + min, 6-bit levels
};

// Bit i of a nibble at bit 8i: one level's fifth bit to each byte of a word.
constexpr uint32_t to_bytes(uint32_t nibble) {
  return (nibble & 1u) | ((nibble & 2u) << 7) | ((nibble & 4u) << 14) | ((nibble & 8u) << 21);
}

// Row j of tile t of one-group blocks (nullptr: a padding row, all zero). A nibble type's group bytes are the tile's
// bytes as they are (byte i: level i low, 16 + i high; the tile's byte 64c + 4j + i holds levels 4c + i and
// 16 + 4c + i), and Q5_0/Q5_1's fifth bits go on top as 6-bit levels' top bits (Q5_K's); Q8_0's 32 int8 levels go four
// a vector, + 128. sc is left out (every scale 1) and dmin too, but Q4_1's and Q5_1's.
int64_t level_bytes(const GroupType& type) { return type.byte_levels ? 32 : type.fifth_bits_at ? 24 : 16; }

void put_group_row(const Out& out, const GroupType& type, int64_t t, int64_t j, const uint8_t* row) {
  const int64_t width = level_bytes(type) * kTileRows;  // a group's bytes in the tile
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
    if (!type.fifth_bits_at) continue;
    const uint32_t fifth = block ? word_at(block + type.fifth_bits_at) : 0;
    for (int64_t e = 0; e < 2; ++e) {  // top chunk e: levels 16e + 4u + i's fifth bit at bit 2u of byte i, u = 0..3
      uint32_t tops = 0;
      for (int64_t u = 0; u < 4; ++u) tops |= to_bytes((fifth >> (16 * e + 4 * u)) & 0xFu) << (2 * u);
      std::memcpy(qs + 256 + e * 64, &tops, 4);
    }
  }
}

template <typename PutRow>
void tiles(const uint8_t* raw, int64_t rows, int64_t row_bytes, int64_t first, int64_t last, PutRow put) {
  for (int64_t t = first; t < last; ++t) {
    for (int64_t j = 0; j < kTileRows; ++j) {
      const int64_t row = t * kTileRows + j;
      put(t, j, row < rows ? raw + row * row_bytes : nullptr);
    }
  }
}

}  // namespace

int64_t k_block_bytes(bool fifth_bits) { return fifth_bits ? kQ5K.bytes : kQ4K.bytes; }
int64_t group_block_bytes(int64_t kind) { return kGroupTypes[kind].bytes; }
int64_t group_level_bytes(int64_t kind) { return level_bytes(kGroupTypes[kind]); }
bool group_with_min(int64_t kind) { return kGroupTypes[kind].with_min; }

void q4_k_tiles(const uint8_t* raw, int64_t rows, int64_t row_bytes, bool fifth_bits, const Out& out, int64_t first,
                int64_t last) {
  const KType& type = fifth_bits ? kQ5K : kQ4K;
  tiles(raw, rows, row_bytes, first, last, [&](int64_t t, int64_t j, const uint8_t* row) { put_row(out, type, t, j, row); });
}

void q6_k_tiles(const uint8_t* raw, int64_t rows, int64_t row_bytes, const Out& out, int64_t first, int64_t last) {
  tiles(raw, rows, row_bytes, first, last, [&](int64_t t, int64_t j, const uint8_t* row) { put_q6_row(out, t, j, row); });
}

void iq4_xs_tiles(const uint8_t* raw, int64_t rows, int64_t row_bytes, const Out& out, int64_t first, int64_t last) {
  tiles(raw, rows, row_bytes, first, last, [&](int64_t t, int64_t j, const uint8_t* row) { put_iq4_xs_row(out, t, j, row); });
}

void group_tiles(int64_t kind, const uint8_t* raw, int64_t rows, int64_t row_bytes, const Out& out, int64_t first,
                 int64_t last) {
  const GroupType& type = kGroupTypes[kind];
  tiles(raw, rows, row_bytes, first, last,
        [&](int64_t t, int64_t j, const uint8_t* row) { put_group_row(out, type, t, j, row); });
}

}  // namespace file_tiles
