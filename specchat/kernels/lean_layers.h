// The lean forward's layer loop (lean_layers.cpp) as bindings.cpp hands it to Python: a face over the
// LayerStack that file keeps to itself, so that it compiles without the Python side (pybind11 and torch's casters,
// 8 s a file here) and only bindings.cpp does. Each call is LayerStack's, documented there.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "q4/q4_kernel.h"

class LayerStack;

class LeanLayers {
 public:
  LeanLayers(int64_t heads, int64_t kv_heads, int64_t head_dim, double scaling);
  ~LeanLayers();
  void add_layer(torch::Tensor input_norm, torch::Tensor post_norm, double eps,
                 std::vector<std::vector<torch::Tensor>> qkv, std::optional<torch::Tensor> qkv_bias,
                 std::vector<torch::Tensor> out, std::optional<torch::Tensor> out_bias,
                 std::vector<std::vector<torch::Tensor>> gate_up, std::optional<torch::Tensor> gate_up_bias,
                 int64_t gate_width, std::vector<torch::Tensor> down, std::optional<torch::Tensor> down_bias);
  void add_head_norms(torch::Tensor q_norm, torch::Tensor k_norm, double eps);
  void add_sandwich_norms(torch::Tensor attention_out_norm, torch::Tensor mlp_out_norm);
  void set_layer_attention(int64_t window, int64_t rope_table);
  void set_activation(const std::string& name);
  void set_softcap(double cap);
  void set_final_norm(torch::Tensor weight, double eps);
  int64_t size() const;
  torch::Tensor forward(torch::Tensor hidden, const std::vector<torch::Tensor>& keys,
                        const std::vector<torch::Tensor>& values, const torch::Tensor& cos, const torch::Tensor& sin,
                        int64_t start);
  torch::Tensor forward_tail(torch::Tensor hidden, const std::vector<torch::Tensor>& keys,
                             const std::vector<torch::Tensor>& values, const torch::Tensor& cos,
                             const torch::Tensor& sin, int64_t start, int64_t keep);
  void time_parts(bool on);
  std::vector<double> part_seconds() const;

 private:
  std::unique_ptr<LayerStack> stack_;
};
