// The lean forward's decoder layers in one C++ call (core/lean_native.py builds it): the same torch
// operations as lean.py's Python loop, in the same order on the same shapes, so every value is
// bitwise the same; only the Python and dispatch work between them is gone (about 75 torch calls a
// layer). For Llama-style layers whose linears are all w4a8 (q4_kernel.cpp) and whose activations
// are float32.
#include <torch/extension.h>
#include <chrono>
#include <optional>
#include <vector>

torch::Tensor q4_linear(torch::Tensor x, torch::Tensor qs, torch::Tensor sc, torch::Tensor m,
                        torch::Tensor d, torch::Tensor dmin);

namespace {

constexpr int64_t MIN_ROWS = 4;  // invariant_attention.py's: fewer rows take another matmul path
using Clock = std::chrono::steady_clock;

// Seconds spent in each part since the last reset, counted only while `on`.
struct PartTimes {
  bool on = false;
  double kernel = 0, matmuls = 0, attention = 0, total = 0;
};

class Stopwatch {
 public:
  Stopwatch(const PartTimes& times, double& into) : into_(times.on ? &into : nullptr) {
    if (into_) start_ = Clock::now();
  }
  ~Stopwatch() {
    if (into_) *into_ += std::chrono::duration<double>(Clock::now() - start_).count();
  }
 private:
  double* into_;
  Clock::time_point start_;
};

// One w4a8 weight matrix: the kernel's arguments after x.
struct Q4Weights {
  torch::Tensor qs, sc, m, d, dmin;
};

// Linear layers that read one input (q/k/v, gate/up, or a single layer): one kernel call per part,
// the parts' outputs side by side, then the bias of all of them (undefined when they have none).
struct Projection {
  std::vector<Q4Weights> parts;
  torch::Tensor bias;
};

struct Layer {
  torch::Tensor input_norm, post_norm;
  double eps;
  Projection qkv, out, gate_up, down;
  int64_t gate_width;
};

Q4Weights weights_from(const std::vector<torch::Tensor>& tensors) {
  TORCH_CHECK(tensors.size() == 5, "a w4a8 weight is 5 tensors (qs, sc, m, d, dmin), not ", tensors.size());
  return {tensors[0], tensors[1], tensors[2], tensors[3], tensors[4]};
}

Projection projection_from(const std::vector<std::vector<torch::Tensor>>& parts,
                           const std::optional<torch::Tensor>& bias) {
  TORCH_CHECK(!parts.empty(), "a projection needs at least one weight");
  Projection projection;
  for (const auto& part : parts) projection.parts.push_back(weights_from(part));
  if (bias) projection.bias = *bias;
  return projection;
}

torch::Tensor padded_matmul(const torch::Tensor& left, const torch::Tensor& right) {
  const int64_t rows = left.size(-2);
  if (rows >= MIN_ROWS) return at::matmul(left, right);
  auto shape = left.sizes().vec();
  shape[shape.size() - 2] = MIN_ROWS - rows;
  const auto padding = at::zeros(shape, left.options());
  return at::matmul(at::cat({left, padding}, -2), right).narrow(-2, 0, rows);
}

torch::Tensor rotate(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const auto rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

}  // namespace

class LeanLayers {
 public:
  LeanLayers(int64_t heads, int64_t kv_heads, int64_t head_dim, double scaling)
      : heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim), scaling_(scaling) {
    TORCH_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0, "heads must be a multiple of kv_heads");
  }

  void add_layer(torch::Tensor input_norm, torch::Tensor post_norm, double eps,
                 std::vector<std::vector<torch::Tensor>> qkv, std::optional<torch::Tensor> qkv_bias,
                 std::vector<torch::Tensor> out, std::optional<torch::Tensor> out_bias,
                 std::vector<std::vector<torch::Tensor>> gate_up, std::optional<torch::Tensor> gate_up_bias,
                 int64_t gate_width, std::vector<torch::Tensor> down, std::optional<torch::Tensor> down_bias) {
    layers_.push_back({input_norm, post_norm, eps, projection_from(qkv, qkv_bias), projection_from({out}, out_bias),
                       projection_from(gate_up, gate_up_bias), projection_from({down}, down_bias), gate_width});
  }

  int64_t size() const { return static_cast<int64_t>(layers_.size()); }

  // hidden [1, fed, hidden] float32 after `start` cached tokens → hidden after every layer; writes
  // each layer's keys and values [kv_heads, capacity, head_dim] at start..start+fed.
  torch::Tensor forward(torch::Tensor hidden, const std::vector<torch::Tensor>& keys,
                        const std::vector<torch::Tensor>& values, const torch::Tensor& cos,
                        const torch::Tensor& sin, const std::optional<torch::Tensor>& mask, int64_t start) {
    TORCH_CHECK(hidden.dim() == 3 && hidden.size(0) == 1 && hidden.scalar_type() == torch::kFloat32,
                "hidden must be float32 [1, fed, hidden]");
    TORCH_CHECK(keys.size() == layers_.size() && values.size() == layers_.size(), "one key and value tensor a layer");
    Stopwatch whole(times_, times_.total);
    c10::InferenceMode inference;
    for (size_t index = 0; index < layers_.size(); ++index)
      hidden = layer(layers_[index], hidden, keys[index], values[index], cos, sin, mask, start);
    return hidden;
  }

  void time_parts(bool on) { times_ = PartTimes{on}; }

  std::vector<double> part_seconds() const {
    return {times_.kernel, times_.matmuls, times_.attention, times_.total};
  }

 private:
  torch::Tensor layer(const Layer& layer, const torch::Tensor& hidden, const torch::Tensor& keys,
                      const torch::Tensor& values, const torch::Tensor& cos, const torch::Tensor& sin,
                      const std::optional<torch::Tensor>& mask, int64_t start) {
    const int64_t fed = hidden.size(1), width = hidden.size(2);
    const auto normed = at::rms_norm(hidden, {width}, layer.input_norm, layer.eps);
    const auto qkv = project(layer.qkv, normed);  // [fed, (heads + 2 kv_heads) head_dim]
    const int64_t q_width = heads_ * head_dim_, kv_width = kv_heads_ * head_dim_;
    auto query = qkv.narrow(1, 0, q_width).view({fed, heads_, head_dim_}).transpose(0, 1);
    auto key = qkv.narrow(1, q_width, kv_width).view({fed, kv_heads_, head_dim_}).transpose(0, 1);
    const auto value = qkv.narrow(1, q_width + kv_width, kv_width).view({fed, kv_heads_, head_dim_}).transpose(0, 1);
    query = rotate(query, cos, sin);
    key = rotate(key, cos, sin);
    const int64_t end = start + fed;
    keys.narrow(1, start, fed).copy_(key);
    values.narrow(1, start, fed).copy_(value);
    const auto attended = attention(query.unsqueeze(0), keys.narrow(1, 0, end).unsqueeze(0),
                                    values.narrow(1, 0, end).unsqueeze(0), mask);
    const auto after_attention = hidden + project(layer.out, attended.reshape({1, fed, -1})).reshape({1, fed, -1});
    const auto gate_up = project(layer.gate_up, at::rms_norm(after_attention, {width}, layer.post_norm, layer.eps));
    const int64_t up_width = gate_up.size(1) - layer.gate_width;
    const auto gate = gate_up.narrow(1, 0, layer.gate_width), up = gate_up.narrow(1, layer.gate_width, up_width);
    const auto mixed = (at::silu(gate) * up).reshape({1, fed, up_width});
    return after_attention + project(layer.down, mixed).reshape({1, fed, -1});
  }

  // x [.., in] → [rows, out] float32: each part's kernel product side by side, plus the bias.
  torch::Tensor project(const Projection& projection, const torch::Tensor& x) {
    Stopwatch watch(times_, times_.matmuls);
    const auto rows = x.reshape({-1, x.size(-1)});
    std::vector<torch::Tensor> outputs;
    for (const auto& w : projection.parts) {
      Stopwatch kernel(times_, times_.kernel);
      outputs.push_back(q4_linear(rows, w.qs, w.sc, w.m, w.d, w.dmin));
    }
    auto y = outputs.size() == 1 ? outputs[0] : at::cat(outputs, 1);
    return projection.bias.defined() ? y + projection.bias : y;
  }

  // invariant_attention.py's batch_invariant_attention: query [1, H, rows, D], keys and values
  // [1, KV, L, D] → [1, rows, H, D].
  torch::Tensor attention(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
                          const std::optional<torch::Tensor>& mask) {
    Stopwatch watch(times_, times_.attention);
    const int64_t rows = query.size(2), length = key.size(2), groups = heads_ / kv_heads_;
    const auto folded = query.reshape({1, kv_heads_, groups * rows, head_dim_});
    auto scores = (padded_matmul(folded, key.transpose(2, 3)) * scaling_).reshape({1, kv_heads_, groups, rows, length});
    if (mask) scores = scores + mask->unsqueeze(2).narrow(-1, 0, length);
    const auto weights = at::softmax(scores, -1, torch::kFloat32).to(query.scalar_type());
    const auto out = padded_matmul(weights.view({1, kv_heads_, groups * rows, length}), value);
    return out.reshape({1, heads_, rows, head_dim_}).transpose(1, 2).contiguous();
  }

  int64_t heads_, kv_heads_, head_dim_;
  double scaling_;
  std::vector<Layer> layers_;
  PartTimes times_;
};

void register_lean_layers(pybind11::module& module) {
  pybind11::class_<LeanLayers>(module, "LeanLayers")
      .def(pybind11::init<int64_t, int64_t, int64_t, double>())
      .def("add_layer", &LeanLayers::add_layer)
      .def("__len__", &LeanLayers::size)
      .def("forward", &LeanLayers::forward, pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("time_parts", &LeanLayers::time_parts)
      .def("part_seconds", &LeanLayers::part_seconds);
}
