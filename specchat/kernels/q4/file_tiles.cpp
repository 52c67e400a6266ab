// A GGUF's Q4_K blocks as stored → the kernel's tiles (q4_tiles.h), written into tensors the caller has placed: what
// quant/q4_tiles.py's Q4Tiles.from_block(loading/gguf/blocks.py's decode_q4_k(raw)) gives, bit for bit (before
// leaving out a dmin equal to d), with no level unpacked and no temporary. A start builds a file's Q4_K layers
// from the file itself this way, where the stored weights would otherwise hold a second copy of them.
#include <ATen/Parallel.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "q4_kernel.h"

namespace {

constexpr int64_t kBlockBytes = 144;  // fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles
constexpr int64_t kGroups = 8;        // 32-input groups a block
constexpr int64_t kTileRows = 16;

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("tile_q4_k: " + what);
}

void require_field(const torch::Tensor& t, const char* name, at::ScalarType type, std::vector<int64_t> shape) {
  require(t.scalar_type() == type && t.is_contiguous() && t.sizes().vec() == shape,
          std::string(name) + " must be a contiguous tensor of the tiles' shape and dtype");
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

// Row j of tile t from its stored bytes (nullptr: a padding row, all zero).
void put_row(const Out& out, int64_t t, int64_t j, const uint8_t* row) {
  for (int64_t b = 0; b < out.blocks; ++b) {
    const uint8_t* block = row ? row + b * kBlockBytes : nullptr;
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
      const uint8_t* bytes = block ? block + 16 + chunk * 32 : nullptr;
      uint8_t* low = out.qs + (t * out.groups + first) * 16 * kTileRows + 4 * j;
      uint8_t* high = low + 16 * kTileRows;
      for (int64_t c = 0; c < 4; ++c) {
        for (int64_t i = 0; i < 4; ++i) {
          const uint8_t a = bytes ? bytes[4 * c + i] : 0, z = bytes ? bytes[16 + 4 * c + i] : 0;
          low[c * 64 + i] = (a & 0x0F) | ((z & 0x0F) << 4);  // levels 4c + i and 16 + 4c + i of group 2p
          high[c * 64 + i] = (a >> 4) | (z & 0xF0);           // the same of group 2p + 1
        }
      }
    }
  }
}

}  // namespace

void tile_q4_k(torch::Tensor raw, torch::Tensor qs, torch::Tensor sc, torch::Tensor m, torch::Tensor d,
               torch::Tensor dmin) {
  require(raw.dim() == 2 && raw.scalar_type() == torch::kByte && raw.is_contiguous(),
          "raw must be contiguous uint8 [rows, blocks·144]");
  require(raw.size(1) > 0 && raw.size(1) % kBlockBytes == 0, "a row must be whole Q4_K blocks of 144 bytes");
  const int64_t rows = raw.size(0), blocks = raw.size(1) / kBlockBytes, groups = blocks * kGroups;
  const int64_t tiles = (rows + kTileRows - 1) / kTileRows;
  require_field(qs, "qs", torch::kByte, {tiles, groups, 16 * kTileRows});
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
        put_row(out, t, j, row < rows ? bytes + row * raw.size(1) : nullptr);
      }
    }
  });
}
