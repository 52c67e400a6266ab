// 4-bit weights × 8-bit activations, batch-invariant: a row's result never depends on the other rows
// fed with it (integer dot products are exact, and every row takes the same float steps in the same
// order whatever the batch), and the same bits on every code path (layout and arithmetic: q4_tiles.h).
//
// The code path is chosen at run time from what the CPU reports (amx, avx512-vnni, avx-vnni, avx2,
// else portable) and can be forced (set_kernel_path) for A/B runs and tests.
//
// Activations x [M, K] float32 are mapped per row and per block onto int8 (scale amax/127), as
// llama.cpp's Q8 blocks do, so an outlier channel costs precision only inside its own block. A row
// holding a NaN or an infinity gives NaN outputs.
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu_features.h"
#include "file_tiles.h"
#include "q4_kernel.h"
#include "q4_tiles.h"
#include "tile_shares.h"

namespace {

using q4::GROUP;
using q4::TILE_ROWS;

struct Activations {
  std::vector<int8_t> levels;   // [M, K]
  std::vector<float> scales;    // [M, K/block]
  std::vector<int16_t> sums;    // [M, K/32]
  std::vector<int16_t> half_sums;  // [M, K/16]
  std::vector<uint8_t> finite;  // [M]: 0 where the row holds a NaN or an infinity
  std::vector<float> float_sums;  // [M, K/32]: sums as floats (exact), for blocks of one group (block 32 only)
};

using RowQuantizer = bool (*)(const float*, int64_t, int64_t, const q4::RowOut&);

Activations quantize_rows(RowQuantizer quantize, const float* x, int64_t rows, int64_t width, int64_t block) {
  Activations a{std::vector<int8_t>(rows * width), std::vector<float>(rows * (width / block)),
                std::vector<int16_t>(rows * (width / GROUP)), std::vector<int16_t>(rows * (width / 16)),
                std::vector<uint8_t>(rows)};
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const q4::RowOut out{a.levels.data() + r * width, a.scales.data() + r * (width / block),
                           a.sums.data() + r * (width / GROUP), a.half_sums.data() + r * (width / 16)};
      a.finite[r] = quantize(x + r * width, width, block, out);
    }
  });
  if (block == GROUP) a.float_sums.assign(a.sums.begin(), a.sums.end());
  return a;
}

// Tiles a thread takes of its own share at a time, and of another's once its own is done (tile_shares.h): 4 and 2
// measured as well as 16 and 4 or 2 and 1 (Qwen3-1.7B shape, one row).
constexpr int64_t TILES_A_TAKE = 4, TILES_A_STEAL = 2;

using TileProduct = void (*)(const q4::Tiles&, const q4::Rows&, const q4::Job&);

struct Path {
  const char* name;
  TileProduct product;  // nullptr: not in this build (build.py compiles the fastest path this CPU has, and portable)
  RowQuantizer quantize;  // the activations' int8 levels: the same bits on every path
  bool (*cpu_has)();
  const char* needs;  // what the CPU lacks when it does not have it
  int64_t tiles_a_job = 1;  // tiles the product takes in one call (q4_tiles.h's Job)

  bool runs() const { return product != nullptr && cpu_has(); }
};

bool always() { return true; }

// The product of each path this build holds (build.py's code_paths: -DSPECCHAT_PATH_<NAME>), else nullptr.
#if defined(__x86_64__) || defined(_M_X64)
#ifdef SPECCHAT_PATH_AMX
constexpr TileProduct AMX = q4::tile_amx;
#else
constexpr TileProduct AMX = nullptr;
#endif
#ifdef SPECCHAT_PATH_AVX512_VNNI
constexpr TileProduct AVX512_VNNI = q4::tile_avx512_vnni;
#else
constexpr TileProduct AVX512_VNNI = nullptr;
#endif
#ifdef SPECCHAT_PATH_AVX_VNNI
constexpr TileProduct AVX_VNNI = q4::tile_avx_vnni;
#else
constexpr TileProduct AVX_VNNI = nullptr;
#endif
#ifdef SPECCHAT_PATH_AVX2
constexpr TileProduct AVX2 = q4::tile_avx2;
#else
constexpr TileProduct AVX2 = nullptr;
#endif
#endif

// Fastest first.
const std::vector<Path>& paths() {
  static const std::vector<Path> all = {
#if defined(__x86_64__) || defined(_M_X64)
      {"amx", AMX, q4::quantize_row_avx2, cpu::has_amx, "AMX-INT8, AVX-512 VNNI and the OS's leave to use the tiles",
       4},  // tiles a job: 2 and 8 measured within a few per cent of 4 (Xeon, 128 rows)
      {"avx512-vnni", AVX512_VNNI, q4::quantize_row_avx2, cpu::has_avx512_vnni, "AVX-512 F/BW/VL/VNNI"},
      {"avx-vnni", AVX_VNNI, q4::quantize_row_avx2, cpu::has_avx_vnni, "AVX-VNNI"},
      {"avx2", AVX2, q4::quantize_row_avx2, cpu::has_avx2, "AVX2 and FMA"},
#endif
      {"portable", q4::tile_portable, q4::quantize_row_portable, always, ""},
  };
  return all;
}

const Path* best_path() {
  for (const auto& path : paths())
    if (path.runs()) return &path;
  return &paths().back();
}

std::atomic<const Path*>& selected() {
  static std::atomic<const Path*> path{best_path()};
  return path;
}

int bits_of(int64_t group_row_bytes) {
  switch (group_row_bytes) {
    case 16 * TILE_ROWS: return 4;
    case 24 * TILE_ROWS: return 6;
    case 32 * TILE_ROWS: return 8;
    default: return 0;
  }
}

// The five tensors of one weight (qs, sc, m, d, dmin) as every path reads them (q4_tiles.h): 16-row tiles of
// 4-, 6- or 8-bit levels, blocks of one 32-group or of 2 to MAX_BLOCK_GROUPS (an even number: the 256-bit and AMX
// paths unpack a block into stack room of that many groups); sc and m uint8 a group, or int8 a 16-input half
// (halves). Returns the 32-groups a row.
int64_t check_tiles(const torch::Tensor& qs, const torch::Tensor& sc, const torch::Tensor& m, const torch::Tensor& d,
                    const torch::Tensor& dmin) {
  for (const auto& t : {qs, sc, m, d, dmin}) TORCH_CHECK(t.device().is_cpu(), "the w4a8 kernel runs on the CPU only, not on ", t.device());
  TORCH_CHECK(qs.dim() == 3 && sc.dim() == 3 && m.dim() == 3 && d.dim() == 3 && dmin.dim() == 3,
              "the weights must be in 16-row tiles (3-dimensional)");
  TORCH_CHECK((qs.scalar_type() == at::kByte || qs.scalar_type() == at::kChar) && qs.is_contiguous(),
              "qs must be contiguous uint8 (levels) or int8 (4-bit table indices)");
  TORCH_CHECK(qs.scalar_type() == at::kByte || qs.size(2) == 16 * TILE_ROWS, "int8 qs must hold 4-bit table indices (16 bytes a row and group), not ",
              qs.size(2) / TILE_ROWS, " bytes a row");
  const bool halves = sc.scalar_type() == at::kChar;
  for (const auto& t : {sc, m})
    TORCH_CHECK(t.scalar_type() == (halves ? at::kChar : at::kByte) && t.is_contiguous(),
                "sc and m must be contiguous uint8 (a group's) or both int8 (a half's)");
  for (const auto& t : {d, dmin}) TORCH_CHECK(t.scalar_type() == torch::kHalf && t.is_contiguous(), "d and dmin must be contiguous float16");
  const int64_t tiles = qs.size(0), groups = qs.size(1), blocks = d.size(1);
  TORCH_CHECK(bits_of(qs.size(2)) != 0, "qs must hold 4-, 6- or 8-bit levels (16, 24 or 32 bytes a row and group), not ",
              qs.size(2), " bytes a tile's group");
  TORCH_CHECK(groups > 0 && groups % 2 == 0, "the weights must take a multiple of 64 inputs, not ", groups * GROUP);
  TORCH_CHECK(blocks > 0 && groups % blocks == 0, "the ", groups, " 32-groups of a row do not split into ", blocks, " blocks");
  const int64_t per_block = groups / blocks;
  TORCH_CHECK((per_block == 1 || per_block % 2 == 0) && per_block <= q4::MAX_BLOCK_GROUPS,
              "a block must hold 1, 2, 4, 6 or 8 32-groups (32 to 256 inputs), not ", per_block);
  TORCH_CHECK(sc.size(2) != 0 || (per_block == 1 && !halves), "only blocks of one 32-group may leave out sc (every scale 1)");
  if (halves) {
    TORCH_CHECK(sc.size(0) == tiles && sc.size(1) == groups && sc.size(2) == 2 * TILE_ROWS, "int8 sc must be [tiles, K/32, 32]");
    TORCH_CHECK(m.size(0) == tiles && m.size(1) == groups && m.size(2) == 2 * TILE_ROWS, "int8 m must be [tiles, K/32, 32]");
  } else {
    TORCH_CHECK(sc.size(0) == tiles && sc.size(1) == groups && (sc.size(2) == TILE_ROWS || sc.size(2) == 0),
                "sc must be [tiles, K/32, 16] (or [tiles, K/32, 0]: every scale 1)");
    TORCH_CHECK(m.size(0) == tiles && m.size(1) * 2 == groups && m.size(2) == 2 * TILE_ROWS, "m must be [tiles, K/64, 32]");
  }
  TORCH_CHECK(d.size(0) == tiles && d.size(1) == blocks && d.size(2) == TILE_ROWS, "d must be float16 [tiles, blocks, 16]");
  TORCH_CHECK(dmin.size(0) == tiles && dmin.size(1) == blocks && (dmin.size(2) == TILE_ROWS || dmin.size(2) == 0),
              "dmin must be float16 [tiles, blocks, 16] (or [tiles, blocks, 0]: dmin is d)");
  return groups;
}

void check_input(const torch::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu(), "the w4a8 kernel runs on the CPU only, not on ", x.device());
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "x must be float32 [M, K]");
}

void check_count(const std::vector<torch::Tensor>& t) {
  TORCH_CHECK(t.size() == 5, "a w4a8 weight is 5 tensors (qs, sc, m, d, dmin), not ", t.size());
}

Q4Part part_from(const std::vector<torch::Tensor>& t, int64_t column) {
  check_count(t);
  const int64_t groups = check_tiles(t[0], t[1], t[2], t[3], t[4]);
  const bool halves = t[1].scalar_type() == at::kChar;
  const auto bytes = [](const torch::Tensor& u) { return static_cast<const uint8_t*>(u.data_ptr()); };
  const auto* d = reinterpret_cast<const uint16_t*>(t[3].data_ptr<at::Half>());
  const bool dmin_is_d = t[4].size(2) == 0, unit_scales = t[1].size(2) == 0;
  const q4::Tiles w{bytes(t[0]), unit_scales ? nullptr : bytes(t[1]), bytes(t[2]), d,
                    dmin_is_d ? d : reinterpret_cast<const uint16_t*>(t[4].data_ptr<at::Half>()), groups, t[3].size(1),
                    t[0].scalar_type() == at::kChar ? q4::TABLE : bits_of(t[0].size(2)), halves, unit_scales};
  return {w, t[0].size(0), column, groups * GROUP / t[3].size(1), groups * GROUP};
}

}  // namespace

Q4Product q4_product_of(const std::vector<std::vector<torch::Tensor>>& weights) {
  TORCH_CHECK(!weights.empty(), "a product needs at least one weight");
  Q4Product product;
  for (const auto& t : weights) {
    product.parts.push_back(part_from(t, product.outputs));
    product.outputs += product.parts.back().tiles * TILE_ROWS;
  }
  return product;
}

// x [M, K] float32 → every part's W x side by side [M, Σ tiles·16]: x mapped onto int8 once per block
// size the parts use, and all the parts' tiles shared out in one parallel loop (one wait, not one a part).
// Each tile's outputs are what q4_linear gives for that part alone, bit for bit.
torch::Tensor q4_run(const Q4Product& product, const torch::Tensor& x) {
  TORCH_CHECK(!product.parts.empty(), "a product needs at least one weight");
  check_input(x);
  for (const auto& part : product.parts)
    TORCH_CHECK(x.size(1) == part.inputs, "x is ", x.size(1), " wide; the weights take ", part.inputs);
  const auto input = x.contiguous();
  const auto& parts = product.parts;
  const int64_t rows = input.size(0), width = input.size(1), columns = product.outputs;
  const Path& path = *selected().load();
  std::map<int64_t, Activations> quantized;  // by block size
  for (const auto& part : parts)
    if (!quantized.count(part.block))
      quantized.emplace(part.block, quantize_rows(path.quantize, input.data_ptr<float>(), rows, width, part.block));
  std::vector<q4::Rows> activations;  // each part's, as the path functions read them
  for (const auto& part : parts) {
    const Activations& a = quantized.at(part.block);
    activations.push_back({a.levels.data(), a.scales.data(), a.sums.data(), a.half_sums.data(), width, a.float_sums.data()});
  }
  auto out = cpu_tensor({rows, columns}, x.scalar_type());
  float* outs = out.data_ptr<float>();
  const TileProduct tile_product = path.product;
  const auto run_tiles = [&](int64_t begin, int64_t end) {
    size_t p = 0;
    for (int64_t tile = begin; tile < end;) {  // runs of at most tiles_a_job tiles of one part
      while (tile * TILE_ROWS >= parts[p].column + parts[p].tiles * TILE_ROWS) ++p;
      const Q4Part& part = parts[p];
      const int64_t first_tile = part.column / TILE_ROWS;
      const int64_t run = std::min({end, first_tile + part.tiles, tile + path.tiles_a_job}) - tile;
      tile_product(part.w, activations[p], {tile - first_tile, 0, rows, outs + part.column, columns, run});
      tile += run;
    }
  };
  TORCH_CHECK(columns / TILE_ROWS < (int64_t{1} << 31), "a product takes fewer than 2^31 tiles, not ", columns / TILE_ROWS);
  const int threads = static_cast<int>(std::min<int64_t>(at::get_num_threads(), columns / TILE_ROWS));
  q4::TileShares shares(columns / TILE_ROWS, threads, TILES_A_TAKE, TILES_A_STEAL);
  at::parallel_for(0, threads, 1, [&](int64_t first, int64_t last) {  // one index a thread (or all of them inline)
    for (int64_t me = first; me < last; ++me)
      for (int64_t begin, end; shares.next(static_cast<int>(me), begin, end);) run_tiles(begin, end);
  });
  const Activations& any = quantized.begin()->second;  // every block size sees the same non-finite rows
  for (int64_t r = 0; r < rows; ++r)
    if (!any.finite[r]) out[r].fill_(std::numeric_limits<float>::quiet_NaN());
  return out;
}

// The weights checked and read (q4_product_of), then run on x: what one call of the module does.
torch::Tensor q4_linear_parts(torch::Tensor x, const std::vector<std::vector<torch::Tensor>>& weights) {
  check_input(x);
  return q4_run(q4_product_of(weights), x);
}

// x [M, K] float32 → W x [M, outs] float32 (outs: the true output rows, at most tiles·16; −1: all).
torch::Tensor q4_linear(torch::Tensor x, torch::Tensor qs, torch::Tensor sc, torch::Tensor m, torch::Tensor d,
                        torch::Tensor dmin, int64_t outs) {
  auto out = q4_linear_parts(x, {{qs, sc, m, d, dmin}});  // checks the weights first
  const int64_t padded = out.size(1);
  if (outs < 0) outs = padded;
  TORCH_CHECK(outs <= padded && outs > padded - TILE_ROWS, "outs must fall in the last tile");
  return outs == padded ? out : out.narrow(1, 0, outs).contiguous();
}

std::string kernel_path() { return selected().load()->name; }

std::vector<std::string> kernel_paths() {
  std::vector<std::string> names;
  for (const auto& path : paths())
    if (path.runs()) names.push_back(path.name);
  return names;
}

void set_kernel_path(const std::string& name) {
  std::string known;
  for (const auto& path : paths()) {
    if (name == path.name) {
      TORCH_CHECK(path.cpu_has(), "kernel path ", name, " needs ", path.needs, ", which this CPU lacks");
      TORCH_CHECK(path.product != nullptr, "kernel path ", name, " is not in this build of the kernel, which holds ",
                  "this CPU's fastest path (runtime.kernel=", name, " builds one with every path)");
      selected().store(&path);
      return;
    }
    known += (known.empty() ? "" : ", ") + std::string(path.name);
  }
  TORCH_CHECK(false, "unknown kernel path ", name, " (known: ", known, ")");
}

// A GGUF's blocks into tiles (file_tiles.cpp does the bytes): the tensors checked against the layout, then a layer's
// tiles shared out over the threads.
namespace {

void require(bool ok, const char* function, const std::string& what) {
  if (!ok) throw std::invalid_argument(std::string(function) + ": " + what);
}

void require_field(const char* function, const torch::Tensor& t, const char* name, at::ScalarType type,
                   std::vector<int64_t> shape) {
  require(t.scalar_type() == type && t.is_contiguous() && t.sizes().vec() == shape, function,
          std::string(name) + " must be a contiguous tensor of the tiles' shape and dtype");
}

// raw's rows, each whole blocks of `bytes` (a multiple of `pairs`·bytes); its tiles.
int64_t raw_tiles(const char* function, const torch::Tensor& raw, int64_t bytes, int64_t pairs, const char* what) {
  require(raw.dim() == 2 && raw.scalar_type() == torch::kByte && raw.is_contiguous(), function,
          "raw must be contiguous uint8 [rows, blocks·bytes]");
  require(raw.size(1) > 0 && raw.size(1) % (pairs * bytes) == 0, function, what);
  return (raw.size(0) + file_tiles::kTileRows - 1) / file_tiles::kTileRows;
}

file_tiles::Out out_of(const torch::Tensor& qs, const torch::Tensor& sc, const torch::Tensor& m, const torch::Tensor& d,
                       const torch::Tensor& dmin, int64_t groups, int64_t blocks) {
  return {static_cast<uint8_t*>(qs.data_ptr()),     static_cast<uint8_t*>(sc.data_ptr()),
          static_cast<uint8_t*>(m.data_ptr()),      static_cast<uint16_t*>(d.data_ptr()),
          static_cast<uint16_t*>(dmin.data_ptr()), groups,
          blocks};
}

template <typename Tiler>
void over_tiles(int64_t tiles, Tiler tiler) {
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) { tiler(begin, end); });
}

}  // namespace

void tile_q4_k(torch::Tensor raw, bool fifth_bits, torch::Tensor qs, torch::Tensor sc, torch::Tensor m,
               torch::Tensor d, torch::Tensor dmin) {
  const char* self = "tile_q4_k";
  const int64_t bytes = file_tiles::k_block_bytes(fifth_bits);
  const int64_t tiles = raw_tiles(self, raw, bytes, 1,
                                  fifth_bits ? "a row must be whole Q5_K blocks of 176 bytes"
                                             : "a row must be whole Q4_K blocks of 144 bytes");
  const int64_t blocks = raw.size(1) / bytes, groups = blocks * file_tiles::kGroups, rows = file_tiles::kTileRows;
  require_field(self, qs, "qs", torch::kByte, {tiles, groups, (fifth_bits ? 24 : 16) * rows});
  require_field(self, sc, "sc", torch::kByte, {tiles, groups, rows});
  require_field(self, m, "m", torch::kByte, {tiles, groups / 2, 2 * rows});
  require_field(self, d, "d", torch::kHalf, {tiles, blocks, rows});
  require_field(self, dmin, "dmin", torch::kHalf, {tiles, blocks, rows});
  const file_tiles::Out out = out_of(qs, sc, m, d, dmin, groups, blocks);
  over_tiles(tiles, [&](int64_t first, int64_t last) {
    file_tiles::q4_k_tiles(raw.data_ptr<uint8_t>(), raw.size(0), raw.size(1), fifth_bits, out, first, last);
  });
}

namespace {

// The fields of a layer in halves (a signed scale per 16 inputs: Q6_K, IQ4_XS) from whole blocks of `bytes`, checked.
file_tiles::Out halves_out(const char* self, const torch::Tensor& raw, int64_t bytes, const char* what, int64_t qs_width,
                           at::ScalarType qs_type, const torch::Tensor& qs, const torch::Tensor& sc,
                           const torch::Tensor& m, const torch::Tensor& d, const torch::Tensor& dmin) {
  const int64_t tiles = raw_tiles(self, raw, bytes, 1, what);
  const int64_t blocks = raw.size(1) / bytes, groups = blocks * file_tiles::kGroups, rows = file_tiles::kTileRows;
  require_field(self, qs, "qs", qs_type, {tiles, groups, qs_width * rows});
  require_field(self, sc, "sc", torch::kChar, {tiles, groups, 2 * rows});
  require_field(self, m, "m", torch::kChar, {tiles, groups, 2 * rows});
  require_field(self, d, "d", torch::kHalf, {tiles, blocks, rows});
  require_field(self, dmin, "dmin", torch::kHalf, {tiles, blocks, rows});
  return out_of(qs, sc, m, d, dmin, groups, blocks);
}

}  // namespace

void tile_q6_k(torch::Tensor raw, torch::Tensor qs, torch::Tensor sc, torch::Tensor m, torch::Tensor d,
               torch::Tensor dmin) {
  const file_tiles::Out out = halves_out("tile_q6_k", raw, file_tiles::kQ6Bytes, "a row must be whole Q6_K blocks of 210 bytes",
                                         24, torch::kByte, qs, sc, m, d, dmin);
  over_tiles(qs.size(0), [&](int64_t first, int64_t last) {
    file_tiles::q6_k_tiles(raw.data_ptr<uint8_t>(), raw.size(0), raw.size(1), out, first, last);
  });
}

void tile_iq4_xs(torch::Tensor raw, torch::Tensor qs, torch::Tensor sc, torch::Tensor m, torch::Tensor d,
                 torch::Tensor dmin) {
  const file_tiles::Out out = halves_out("tile_iq4_xs", raw, file_tiles::kIQ4XSBytes,
                                         "a row must be whole IQ4_XS blocks of 136 bytes", 16, torch::kChar, qs, sc, m, d, dmin);
  over_tiles(qs.size(0), [&](int64_t first, int64_t last) {
    file_tiles::iq4_xs_tiles(raw.data_ptr<uint8_t>(), raw.size(0), raw.size(1), out, first, last);
  });
}

void tile_group_blocks(torch::Tensor raw, int64_t kind, torch::Tensor qs, torch::Tensor m, torch::Tensor d,
                       torch::Tensor dmin) {
  const char* self = "tile_group_blocks";
  require(kind >= 0 && kind < 6, self, "kind must be 0 (Q4_0), 1 (Q4_1), 2 (IQ4_NL), 3 (Q8_0), 4 (Q5_0) or 5 (Q5_1)");
  const int64_t bytes = file_tiles::group_block_bytes(kind);
  const int64_t tiles = raw_tiles(self, raw, bytes, 2, "a row must be an even number of whole blocks");
  const int64_t groups = raw.size(1) / bytes, rows = file_tiles::kTileRows;
  const std::vector<int64_t> qs_shape{tiles, groups, file_tiles::group_level_bytes(kind) * rows};
  require((qs.scalar_type() == torch::kByte || qs.scalar_type() == torch::kChar) && qs.is_contiguous() &&
              qs.sizes().vec() == qs_shape,
          self, "qs must be a contiguous tensor of the tiles' shape");
  require_field(self, m, "m", torch::kByte, {tiles, groups / 2, 2 * rows});
  require_field(self, d, "d", torch::kHalf, {tiles, groups, rows});
  require_field(self, dmin, "dmin", torch::kHalf, {tiles, groups, file_tiles::group_with_min(kind) ? rows : 0});
  const file_tiles::Out out = out_of(qs, qs, m, d, dmin, groups, groups);  // sc: not written
  over_tiles(tiles, [&](int64_t first, int64_t last) {
    file_tiles::group_tiles(kind, raw.data_ptr<uint8_t>(), raw.size(0), raw.size(1), out, first, last);
  });
}
