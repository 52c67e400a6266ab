// What the kernel module's sources call of each other (q4_kernel.cpp, lean_layers.cpp, bindings.cpp). Tensors
// only: bindings.cpp alone includes the Python side.
#pragma once
// ATen's tensor and its CPU allocation, not <torch/types.h> (all of ATen: 5.7 s a file here against 1.5) nor
// <ATen/ops/empty.h> (the dispatcher's factory: 4.5 s more a file on a Zen 3); `torch::` names ATen's, as
// <torch/types.h> makes it.
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
namespace torch {
using namespace at;  // NOLINT: torch::Tensor, torch::kFloat, as <torch/types.h> makes them
}  // namespace torch

// A new contiguous CPU tensor of these sizes, its contents unset (torch.empty's, without the dispatcher).
inline torch::Tensor cpu_tensor(at::IntArrayRef sizes, at::ScalarType type) {
  return torch::Tensor(at::detail::empty_cpu(sizes, type));
}

#include <string>
#include <vector>

#include "q4_tiles.h"

// x [M, K] float32 → W x [M, outs] float32, the weights in 16-row tiles (q4_tiles.h).
torch::Tensor q4_linear(torch::Tensor x, torch::Tensor qs, torch::Tensor sc, torch::Tensor m, torch::Tensor d,
                        torch::Tensor dmin, int64_t outs);

// x [M, K] → the products of several such weights (each 5 tensors: qs, sc, m, d, dmin) side by side,
// [M, Σ tiles·16]: x quantized once, one parallel loop over all their tiles; the same bits as q4_linear's.
torch::Tensor q4_linear_parts(torch::Tensor x, const std::vector<std::vector<torch::Tensor>>& weights);

// One weight of a product as the code paths read it (q4_tiles.h), where its outputs go among the product's, and
// the inputs it takes.
struct Q4Part {
  q4::Tiles w;
  int64_t tiles, column, block, inputs;  // its 16-row tiles, its first output column, inputs a block, K
};

// Weights (each 5 tensors: qs, sc, m, d, dmin) checked as q4_linear_parts checks them, and their raw pointers: a
// product to run (q4_run) while its tensors stay as they were checked. Outputs: Σ tiles·16.
struct Q4Product {
  std::vector<Q4Part> parts;
  int64_t outputs = 0;
};
Q4Product q4_product_of(const std::vector<std::vector<torch::Tensor>>& weights);

// x [M, K] float32 (checked here) → the product's outputs [M, outputs]; its weights are not looked at again.
torch::Tensor q4_run(const Q4Product& product, const torch::Tensor& x);

// A GGUF's Q4_K blocks, uint8 [rows, blocks·144] (Q5_K's, [rows, blocks·176], with fifth_bits), Q6_K blocks,
// [rows, blocks·210], or IQ4_XS blocks, [rows, blocks·136] → written into the tiles qs, sc, m, d, dmin (their shapes
// and dtypes as Q4Tiles holds them, dmin whole) (file_tiles.cpp).
void tile_q4_k(torch::Tensor raw, bool fifth_bits, torch::Tensor qs, torch::Tensor sc, torch::Tensor m,
               torch::Tensor d, torch::Tensor dmin);
void tile_q6_k(torch::Tensor raw, torch::Tensor qs, torch::Tensor sc, torch::Tensor m, torch::Tensor d,
               torch::Tensor dmin);
void tile_iq4_xs(torch::Tensor raw, torch::Tensor qs, torch::Tensor sc, torch::Tensor m, torch::Tensor d,
                 torch::Tensor dmin);
// Blocks of one 32-group, uint8 [rows, groups·bytes], kind 0 Q4_0, 1 Q4_1, 2 IQ4_NL, 3 Q8_0, 4 Q5_0, 5 Q5_1 → the
// tiles qs, m, d and Q4_1's and Q5_1's dmin (the others' [tiles, groups, 0]: it is d), their scales left out (every one 1)
// (file_tiles.cpp).
void tile_group_blocks(torch::Tensor raw, int64_t kind, torch::Tensor qs, torch::Tensor m, torch::Tensor d,
                       torch::Tensor dmin);

std::string kernel_path();                    // the code path the product runs
std::vector<std::string> kernel_paths();      // the paths this build holds and this CPU runs, fastest first
void set_kernel_path(const std::string& name);  // run the product on this path

// logits [rows, vocab] float32 → probabilities after temperature, top-k (0: off), top-p (1: off) (sampling.cpp).
torch::Tensor top_p_probs(torch::Tensor logits, double temperature, int64_t top_k, double top_p);

// logits [rows, vocab] float32 → [argmax int64 [rows], log-sum-exp float32 [rows]] (sampling.cpp).
std::vector<torch::Tensor> greedy_rows(torch::Tensor logits);

