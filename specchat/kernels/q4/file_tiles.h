// The shuffles of a GGUF's blocks into the kernel's tiles (file_tiles.cpp): plain C++ on bytes, no torch, so the file
// compiles in a moment; q4_kernel.cpp checks the tensors and runs these over a layer's tiles in parallel.
#pragma once
#include <cstdint>

namespace file_tiles {

constexpr int64_t kTileRows = 16;
constexpr int64_t kGroups = 8;  // 32-input groups a K block

// Where a layer's tiles go (q4_tiles.h): sc is not written for blocks of one group (every scale 1), nor dmin where it
// is d (all of those types but Q4_1).
struct Out {
  uint8_t *qs, *sc, *m;
  uint16_t *d, *dmin;
  int64_t groups, blocks;
};

// Bytes of a block: Q4_K 144, Q5_K 176, Q6_K 210, IQ4_XS 136; of a one-group type's (kind 0 Q4_0, 1 Q4_1, 2 IQ4_NL,
// 3 Q8_0, 4 Q5_0, 5 Q5_1).
int64_t k_block_bytes(bool fifth_bits);
constexpr int64_t kQ6Bytes = 210;
constexpr int64_t kIQ4XSBytes = 136;
int64_t group_block_bytes(int64_t kind);
int64_t group_level_bytes(int64_t kind);  // a group's bytes a tile row: Q8_0 32 (a byte a level), Q5_0/Q5_1 24
                                          // (6-bit levels), else 16 (a nibble)
bool group_with_min(int64_t kind);        // Q4_1, Q5_1: dmin is the block's −min, written

// Tiles first..last − 1 of a layer whose rows (`rows` of `row_bytes`) are `raw`.
void q4_k_tiles(const uint8_t* raw, int64_t rows, int64_t row_bytes, bool fifth_bits, const Out& out, int64_t first,
                int64_t last);
void q6_k_tiles(const uint8_t* raw, int64_t rows, int64_t row_bytes, const Out& out, int64_t first, int64_t last);
void iq4_xs_tiles(const uint8_t* raw, int64_t rows, int64_t row_bytes, const Out& out, int64_t first, int64_t last);
void group_tiles(int64_t kind, const uint8_t* raw, int64_t rows, int64_t row_bytes, const Out& out, int64_t first,
                 int64_t last);

}  // namespace file_tiles
