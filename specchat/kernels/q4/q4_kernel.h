// What the kernel module's sources call of each other (q4_kernel.cpp, lean_layers.cpp, bindings.cpp).
#pragma once
#include <torch/extension.h>

// x [M, K] float32 → W x [M, outs] float32, the weights in 16-row tiles (q4_tiles.h).
torch::Tensor q4_linear(torch::Tensor x, torch::Tensor qs, torch::Tensor sc, torch::Tensor m, torch::Tensor d,
                        torch::Tensor dmin, int64_t outs);

// x [M, K] → the products of several such weights (each 5 tensors: qs, sc, m, d, dmin) side by side,
// [M, Σ tiles·16]: x quantized once, one parallel loop over all their tiles; the same bits as q4_linear's.
torch::Tensor q4_linear_parts(torch::Tensor x, const std::vector<std::vector<torch::Tensor>>& weights);

// A w4a8 weight (qs, sc, m, d, dmin) checked as the product checks it: its inputs (K) and outputs (tiles·16).
struct Q4Shape {
  int64_t inputs, outputs;
};
Q4Shape q4_weight_shape(const std::vector<torch::Tensor>& weight);

std::string kernel_path();                    // the code path the product runs
std::vector<std::string> kernel_paths();      // the paths this CPU can run, fastest first
void set_kernel_path(const std::string& name);  // run the product on this path

// logits [rows, vocab] float32 → probabilities after temperature, top-k (0: off), top-p (1: off) (sampling.cpp).
torch::Tensor top_p_probs(torch::Tensor logits, double temperature, int64_t top_k, double top_p);

// logits [rows, vocab] float32 → [argmax int64 [rows], log-sum-exp float32 [rows]] (sampling.cpp).
std::vector<torch::Tensor> greedy_rows(torch::Tensor logits);

void register_lean_layers(pybind11::module& module);  // lean_layers.cpp
