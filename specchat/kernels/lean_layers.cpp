// The lean forward's decoder layers in one C++ call (runtime/lean_native.py builds it), for Llama-style
// layers whose linears are all w4a8 (q4_kernel.cpp) and whose activations are float32. Between the
// kernel's products, everything (RMSNorm, biases, rotary embedding, the KV cache write, attention,
// SiLU, residuals) is a plain loop over one row's numbers: no torch dispatch, and a row's result
// never depends on how many rows were fed with it (each row takes the same steps in the same order),
// so a verification forward gives bitwise what one-token steps give. Qwen3's layers norm each head's query
// and key (add_head_norms) before the rotation. Gemma's layers add norms after attention and after the MLP
// (add_sandwich_norms), a GELU-tanh MLP (set_activation), soft-capped scores (set_softcap), and windows and
// rotary tables of their own (set_layer_attention); their 1 + w norms come folded into the weights.
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "lean_layers.h"
#include "q4/q4_kernel.h"
#include "simd.h"

namespace {

using Clock = std::chrono::steady_clock;
using simd::F8;
using simd::LANES;

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

// Linear layers that read one input (q/k/v, gate/up, or a single layer): one kernel call for all the
// parts (each a w4a8 weight: qs, sc, m, d, dmin), their outputs side by side, then the bias of all of
// them (undefined when they have none).
struct Projection {
  std::vector<std::vector<torch::Tensor>> parts;
  torch::Tensor bias;
};

struct Layer {
  torch::Tensor input_norm, post_norm;
  double eps;
  Projection qkv, out, gate_up, down;
  int64_t gate_width;
  torch::Tensor q_norm, k_norm;  // RMSNorm weights [head_dim] over each head's query and key; undefined: none
  double head_eps = 0;
  torch::Tensor attention_out_norm, mlp_out_norm;  // Gemma's norms of o_proj's and down's outputs; undefined: none
  int64_t window = 0;  // the keys a row reads: its own and the window − 1 before it; 0: every earlier one
  int64_t rope_table = 0;  // which of the forward's rotary tables the layer takes
};

Projection projection_from(const std::vector<std::vector<torch::Tensor>>& parts,
                           const std::optional<torch::Tensor>& bias) {
  TORCH_CHECK(!parts.empty(), "a projection needs at least one weight");
  Projection projection{parts, {}};
  if (bias) projection.bias = bias->contiguous();  // checked with the layer (LayerStack::check_layer)
  return projection;
}

// A projection's weights and bias against the layer around it: `inputs` wide in, `outputs` wide out (its
// parts side by side). Checks of the tensors' metadata only, so every forward runs it for every layer; what it
// returns is the product to run in that forward (the weights' pointers read while they were checked).
Q4Product checked_product(const Projection& projection, const char* name, int64_t inputs, int64_t outputs) {
  Q4Product product = q4_product_of(projection.parts);
  for (const auto& part : product.parts)
    TORCH_CHECK(part.inputs == inputs, name, " takes ", part.inputs, " inputs; the layer feeds it ", inputs);
  TORCH_CHECK(product.outputs == outputs, name, " gives ", product.outputs, " outputs; the layer takes ", outputs);
  const torch::Tensor& bias = projection.bias;
  if (bias.defined())
    TORCH_CHECK(bias.device().is_cpu() && bias.dim() == 1 && bias.scalar_type() == at::kFloat &&
                bias.is_contiguous() && bias.size(0) == outputs, name, "'s bias must be float32 [", outputs,
                "] on the CPU, not ", bias.scalar_type(), " ", bias.sizes(), " on ", bias.device());
  return product;
}

// A layer's four products, as checked_product gives them for one forward.
struct LayerProducts {
  Q4Product qkv, out, gate_up, down;
};

// x [rows, width] → RMSNorm(x) · weight, per row (sum of squares in 8 lanes, then lane_sum).
void rms_norm_rows(const float* x, const float* weight, int64_t rows, int64_t width, double eps, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x + r * width;
    F8 squares = simd::splat(0.f);
    for (int64_t i = 0; i < width; i += LANES) {
      const F8 v = simd::load(in + i);
      squares = squares + v * v;
    }
    const float mean = simd::lane_sum(squares) / static_cast<float>(width);
    const F8 scale = simd::splat(1.0f / std::sqrt(mean + static_cast<float>(eps)));
    for (int64_t i = 0; i < width; i += LANES)
      simd::store(out + r * width + i, simd::load(in + i) * scale * simd::load(weight + i));
  }
}

// `count` heads [dim] one after another at x, each RMS-normed in place by weight; nothing where it is undefined.
void norm_heads(float* x, const torch::Tensor& weight, int64_t count, int64_t dim, double eps) {
  if (weight.defined()) rms_norm_rows(x, weight.data_ptr<float>(), count, dim, eps, x);
}

// x [rows, width] += y [rows, width] (both with their own row strides).
void add_rows(float* x, int64_t x_stride, const float* y, int64_t y_stride, int64_t rows, int64_t width) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < width; i += LANES) {
      float* at = x + r * x_stride + i;
      simd::store(at, simd::load(at) + simd::load(y + r * y_stride + i));
    }
}

// One head's vector [dim] rotated by its position's cos and sin [dim], as transformers'
// apply_rotary_pos_emb: x·cos + (−x[half:], x[:half])·sin.
void rotate_into(const float* x, const float* cos, const float* sin, int64_t dim, float* out) {
  const int64_t half = dim / 2;
  for (int64_t d = 0; d < half; ++d) out[d] = x[d] * cos[d] + -x[d + half] * sin[d];
  for (int64_t d = half; d < dim; ++d) out[d] = x[d] * cos[d] + x[d - half] * sin[d];
}

// gate_up [rows, 2·width] → act(gate)·up [rows, width]: silu(g) = g / (1 + e^−g), or (gelu_tanh) GELU's tanh
// form 0.5·g·(1 + tanh(√(2/π)·(g + 0.044715·g³))), computed as g / (1 + e^−2·√(2/π)·(g + 0.044715·g³)) (the same
// function: 0.5·(1 + tanh(z)) = 1 / (1 + e^−2z)).
void act_mul_rows(const float* gate_up, int64_t rows, int64_t width, bool gelu_tanh, float* out) {
  const F8 one = simd::splat(1.0f), zero = simd::splat(0.f);
  const F8 linear = simd::splat(1.5957691216057308f), cubic = simd::splat(1.5957691216057308f * 0.044715f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < width; i += LANES) {
      const F8 gate = simd::load(gate_up + r * 2 * width + i);
      const F8 up = simd::load(gate_up + r * 2 * width + width + i);
      const F8 z = gelu_tanh ? gate * (linear + cubic * gate * gate) : gate;
      simd::store(out + r * width + i, gate / (one + simd::exp(zero - z)) * up);
    }
}

// Keys and values as the cache stores them: float32, or float16 / bfloat16 (half the bytes; rounded to
// nearest even when written, read back exactly). A finite value past float16's range is stored as its largest
// (±65504), not as an infinity that would make every later step NaN; a NaN or an infinity stays what it is.
inline F8 load_stored(const float* p) { return simd::load(p); }
inline F8 load_stored(const c10::Half* p) { return simd::load_half(reinterpret_cast<const uint16_t*>(p)); }
inline F8 load_stored(const c10::BFloat16* p) { return simd::load_bf16(reinterpret_cast<const uint16_t*>(p)); }
inline void store_row(const float* x, int64_t n, float* out) { std::copy(x, x + n, out); }
inline void store_row(const float* x, int64_t n, c10::Half* out) {
  constexpr float largest = 65504.f;
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    out[i] = c10::Half(std::isfinite(v) ? std::fmin(std::fmax(v, -largest), largest) : v);
  }
}
inline void store_row(const float* x, int64_t n, c10::BFloat16* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = c10::BFloat16(x[i]);
}

constexpr int MAX_HEADS = 8;       // query heads attended together (their sums stay in registers)
constexpr int64_t VALUE_ROWS = 64;  // value rows a pass over their width takes (64 rows of 128: 16-32 KB, in L1)

// The scores q·k · scaling of G query heads (queries: G·dim floats, head after head) against keys
// [length, dim], into scores [G][padded]: fused multiply-adds over 8-lane chunks in order, then the
// lanes' sum. Each key row is read once for all G heads; best[g]: each head's highest score.
template <int G, typename T>
void head_scores(const float* queries, const T* keys, int64_t length, int64_t dim, float scaling, int64_t padded,
                 float* scores, float* best) {
  for (int g = 0; g < G; ++g) best[g] = -INFINITY;
  for (int64_t j = 0; j < length; ++j) {
    F8 sums[G];
    for (int g = 0; g < G; ++g) sums[g] = simd::splat(0.f);
    for (int64_t d = 0; d < dim; d += LANES) {
      const F8 key = load_stored(keys + j * dim + d);
      for (int g = 0; g < G; ++g) sums[g] = simd::fma(simd::load(queries + g * dim + d), key, sums[g]);
    }
    for (int g = 0; g < G; ++g) {
      scores[g * padded + j] = simd::lane_sum(sums[g]) * scaling;
      best[g] = std::max(best[g], scores[g * padded + j]);
    }
  }
}

// One head's scores [length] (room for padded) → tanh(score / cap)·cap (Gemma-2's soft-capping), in place; its
// highest. What lies past length is overwritten by numerators.
float soft_cap(float* row, int64_t length, int64_t padded, float cap) {
  const F8 limit = simd::splat(cap);
  for (int64_t j = 0; j < padded; j += LANES) simd::store(row + j, simd::tanh(simd::load(row + j) / limit) * limit);
  float best = -INFINITY;
  for (int64_t j = 0; j < length; ++j) best = std::max(best, row[j]);
  return best;
}

// One head's scores [length] (room for padded) → softmax's numerators e^(score − best), in place; their sum, in order.
float numerators(float* row, int64_t length, int64_t padded, float best) {
  std::fill(row + length, row + padded, -INFINITY);
  const F8 shift = simd::splat(best);
  for (int64_t j = 0; j < padded; j += LANES) simd::store(row + j, simd::exp(simd::load(row + j) - shift));
  float total = 0.f;
  for (int64_t j = 0; j < length; ++j) total += row[j];
  return total;
}

// out [G][dim] = Σ_j weights[g][j] · v_j (j in order) / total[g]. VALUE_ROWS value rows at a time, so each
// is read from memory once (not once per 8-lane chunk of its width), the sums kept in `out` between blocks.
template <int G, typename T>
void weighted_values(const float* weights, const float* total, const T* values, int64_t length, int64_t dim,
                     int64_t padded, float* out) {
  std::fill(out, out + G * dim, 0.f);
  for (int64_t from = 0; from < length; from += VALUE_ROWS) {
    const int64_t to = std::min(length, from + VALUE_ROWS);
    for (int64_t d = 0; d < dim; d += LANES) {
      F8 sums[G];
      for (int g = 0; g < G; ++g) sums[g] = simd::load(out + g * dim + d);
      for (int64_t j = from; j < to; ++j) {
        const F8 value = load_stored(values + j * dim + d);
        for (int g = 0; g < G; ++g) sums[g] = simd::fma(simd::splat(weights[g * padded + j]), value, sums[g]);
      }
      for (int g = 0; g < G; ++g) simd::store(out + g * dim + d, sums[g]);
    }
  }
  for (int g = 0; g < G; ++g) {
    const F8 inverse = simd::splat(1.0f / total[g]);
    for (int64_t d = 0; d < dim; d += LANES) simd::store(out + g * dim + d, simd::load(out + g * dim + d) * inverse);
  }
}

// G query heads of one row that share a key/value head over keys and values [length, dim]:
// softmax(q·k · scaling, soft-capped where cap > 0) · v into out (G·dim). Each head's numbers take the same steps in the same order
// whatever G is and whatever other rows are fed, so the forward stays batch-invariant. scores: G·padded floats.
template <int G, typename T>
void attend_heads(const float* queries, const T* keys, const T* values, int64_t length, int64_t dim, float scaling,
                  float cap, float* scores, float* out) {
  const int64_t padded = (length + LANES - 1) / LANES * LANES;
  float best[G], total[G];
  head_scores<G>(queries, keys, length, dim, scaling, padded, scores, best);
  if (cap > 0)
    for (int g = 0; g < G; ++g) best[g] = soft_cap(scores + g * padded, length, padded, cap);
  for (int g = 0; g < G; ++g) total[g] = numerators(scores + g * padded, length, padded, best[g]);
  weighted_values<G>(scores, total, values, length, dim, padded, out);
}

// attend_heads for `count` heads (1..MAX_HEADS), chosen at run time.
template <typename T, int G = MAX_HEADS>
void attend_count(int count, const float* queries, const T* keys, const T* values, int64_t length, int64_t dim,
                  float scaling, float cap, float* scores, float* out) {
  if constexpr (G > 1) {
    if (count < G) return attend_count<T, G - 1>(count, queries, keys, values, length, dim, scaling, cap, scores, out);
  }
  attend_heads<G>(queries, keys, values, length, dim, scaling, cap, scores, out);
}

constexpr int64_t MAX_SIZE = int64_t{1} << 24;  // the most heads, head_dim, hidden or MLP width taken (no overflow)

// A norm's weight as rms_norm_rows reads it: `width` contiguous float32 on the CPU.
void check_norm(const torch::Tensor& weight, int64_t width, const char* name) {
  TORCH_CHECK(weight.device().is_cpu() && weight.dim() == 1 && weight.scalar_type() == at::kFloat &&
              weight.is_contiguous(), name, " must be a contiguous float32 vector on the CPU, not ", weight.scalar_type(),
              " ", weight.sizes(), " on ", weight.device());
  TORCH_CHECK(weight.size(0) == width, name, " is ", weight.size(0), " wide; the layers are ", width);
}

// The hidden width a first norm gives the layers: a positive multiple of 8 (the loops take 8 floats at a time).
int64_t width_from(const torch::Tensor& norm, const char* name) {
  TORCH_CHECK(norm.dim() == 1, name, " must be a vector, not ", norm.sizes());
  const int64_t width = norm.size(0);
  TORCH_CHECK(width > 0 && width % LANES == 0 && width <= MAX_SIZE, "norm weights must be a multiple of 8 wide, not ", width);
  return width;
}

}  // namespace

// The layers and what runs them; LeanLayers (lean_layers.h) is its face to bindings.cpp.
class LayerStack {
 public:
  LayerStack(int64_t heads, int64_t kv_heads, int64_t head_dim, double scaling)
      : heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim), scaling_(static_cast<float>(scaling)) {
    TORCH_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0 && heads <= MAX_SIZE,
                "heads must be a multiple of kv_heads (both positive, at most 2^24): heads ", heads, ", kv_heads ", kv_heads);
    TORCH_CHECK(head_dim > 0 && head_dim % (2 * LANES) == 0 && head_dim <= MAX_SIZE / heads,
                "head_dim must be a multiple of 16, positive, and heads·head_dim at most 2^24, not ", head_dim);
  }

  // One decoder layer's weights, checked against the model (heads, head_dim, the hidden width of the layers
  // before it and of the final norm) before it is kept.
  void add_layer(torch::Tensor input_norm, torch::Tensor post_norm, double eps,
                 std::vector<std::vector<torch::Tensor>> qkv, std::optional<torch::Tensor> qkv_bias,
                 std::vector<torch::Tensor> out, std::optional<torch::Tensor> out_bias,
                 std::vector<std::vector<torch::Tensor>> gate_up, std::optional<torch::Tensor> gate_up_bias,
                 int64_t gate_width, std::vector<torch::Tensor> down, std::optional<torch::Tensor> down_bias) {
    Layer layer{input_norm, post_norm, eps, projection_from(qkv, qkv_bias), projection_from({out}, out_bias),
                projection_from(gate_up, gate_up_bias), projection_from({down}, down_bias), gate_width};
    const int64_t width = width_ ? width_ : width_from(input_norm, "input_norm");
    check_layer(layer, width);
    width_ = width;
    layers_.push_back(std::move(layer));
  }

  // RMSNorm weights [head_dim] over each head's query and key in the layer added last (Qwen3's q_norm, k_norm).
  void add_head_norms(torch::Tensor q_norm, torch::Tensor k_norm, double eps) {
    TORCH_CHECK(!layers_.empty(), "add_layer before its head norms");
    check_norm(q_norm, head_dim_, "q_norm");
    check_norm(k_norm, head_dim_, "k_norm");
    Layer& layer = layers_.back();
    layer.q_norm = q_norm;
    layer.k_norm = k_norm;
    layer.head_eps = eps;
  }

  // Norms [width] of the layer added last's attention output (before its residual add) and MLP output (Gemma's
  // post_attention_layernorm and post_feedforward_layernorm; add_layer's post_norm is then its pre_feedforward one),
  // with the layer's eps.
  void add_sandwich_norms(torch::Tensor attention_out_norm, torch::Tensor mlp_out_norm) {
    TORCH_CHECK(!layers_.empty(), "add_layer before its sandwich norms");
    check_norm(attention_out_norm, width_, "the attention output's norm");
    check_norm(mlp_out_norm, width_, "the MLP output's norm");
    layers_.back().attention_out_norm = attention_out_norm;
    layers_.back().mlp_out_norm = mlp_out_norm;
  }

  // The layer added last reads a sliding window of `window` keys (0: all of them) and takes rotary table
  // `rope_table` of the forward's cos and sin.
  void set_layer_attention(int64_t window, int64_t rope_table) {
    TORCH_CHECK(!layers_.empty(), "add_layer before its attention's window");
    TORCH_CHECK(window >= 0 && rope_table >= 0, "window and rope_table must be >= 0, not ", window, ", ", rope_table);
    layers_.back().window = window;
    layers_.back().rope_table = rope_table;
  }

  // The MLP's activation for every layer: "silu" (the default) or "gelu_tanh".
  void set_activation(const std::string& name) {
    TORCH_CHECK(name == "silu" || name == "gelu_tanh", "the activation must be silu or gelu_tanh, not ", name);
    gelu_tanh_ = name == "gelu_tanh";
  }

  // Attention scores soft-capped as tanh(s / cap)·cap in every layer (Gemma-2's); 0: not capped.
  void set_softcap(double cap) {
    TORCH_CHECK(cap >= 0, "the soft-cap must be >= 0, not ", cap);
    softcap_ = static_cast<float>(cap);
  }

  // The decoder's norm after its last layer (what forward_tail applies).
  void set_final_norm(torch::Tensor weight, double eps) {
    const int64_t width = width_ ? width_ : width_from(weight, "the final norm");
    check_norm(weight, width, "the final norm");
    width_ = width;
    final_norm_ = weight;
    final_eps_ = eps;
  }

  int64_t size() const { return static_cast<int64_t>(layers_.size()); }

  // hidden [1, fed, hidden] float32 after `start` cached tokens → hidden after every layer; writes
  // each layer's keys and values [kv_heads, capacity, head_dim] at start..start+fed. Row i attends
  // to the keys up to start + i (a window: the last `window` of them). cos, sin: [fed, head_dim], the rows' rotary
  // tables, or [tables, fed, head_dim], each layer taking its own (set_layer_attention).
  torch::Tensor forward(torch::Tensor hidden, const std::vector<torch::Tensor>& keys,
                        const std::vector<torch::Tensor>& values, const torch::Tensor& cos,
                        const torch::Tensor& sin, int64_t start) {
    check_hidden(hidden, start);
    const int64_t fed = hidden.size(1), width = hidden.size(2);
    check_tables(cos, sin, fed);
    check_caches(keys, values, fed, start);
    std::vector<LayerProducts> products;  // the tensors may have changed since add_layer: checked again, all of them
    products.reserve(layers_.size());
    for (const auto& layer : layers_) products.push_back(check_layer(layer, width_));
    Stopwatch whole(times_, times_.total);
    c10::InferenceMode inference;
    auto state = hidden.reshape({fed, width}).clone(at::MemoryFormat::Contiguous);
    auto normed = cpu_tensor(state.sizes(), state.scalar_type());
    auto attended = cpu_tensor({fed, heads_ * head_dim_}, state.scalar_type());
    for (size_t index = 0; index < layers_.size(); ++index)
      layer(layers_[index], products[index], state, normed, attended, keys[index], values[index], cos, sin, start);
    return state.view({1, fed, width});
  }

  // forward, then the final norm of its last `keep` rows (all of them when fewer were fed): [1, rows, hidden].
  // The norm runs here, while the rows are in cache: a torch call after a forward that streamed the weights
  // found its own code and data evicted (0.5 ms for one row's norm here).
  torch::Tensor forward_tail(torch::Tensor hidden, const std::vector<torch::Tensor>& keys,
                             const std::vector<torch::Tensor>& values, const torch::Tensor& cos,
                             const torch::Tensor& sin, int64_t start, int64_t keep) {
    TORCH_CHECK(final_norm_.defined(), "set_final_norm first");
    TORCH_CHECK(keep >= 1, "keep must be >= 1, not ", keep);
    check_norm(final_norm_, width_, "the final norm");
    TORCH_CHECK(hidden.dim() == 3 && hidden.size(2) == width_, "hidden must be [1, fed, ", width_, "] for the final norm, not ",
                hidden.sizes());
    const auto state = forward(hidden, keys, values, cos, sin, start);
    const int64_t fed = state.size(1), width = state.size(2), rows = std::min(keep, fed);
    auto out = cpu_tensor({1, rows, width}, state.scalar_type());
    rms_norm_rows(state.data_ptr<float>() + (fed - rows) * width, final_norm_.data_ptr<float>(), rows, width,
                  final_eps_, out.data_ptr<float>());
    return out;
  }

  void time_parts(bool on) { times_ = PartTimes{on}; }

  std::vector<double> part_seconds() const {
    return {times_.kernel, times_.matmuls, times_.attention, times_.total};
  }

 private:
  // What every layer's loops assume of its tensors: norms `width` wide, q/k/v from `width` to the heads, o_proj
  // from the heads back to `width` (added into the rows with their stride), gate/up to twice gate_width, down back
  // to `width`, each bias as wide as its outputs.
  LayerProducts check_layer(const Layer& layer, int64_t width) const {
    check_norm(layer.input_norm, width, "input_norm");
    check_norm(layer.post_norm, width, "post_norm");
    TORCH_CHECK(layer.gate_width > 0 && layer.gate_width % LANES == 0 && layer.gate_width <= MAX_SIZE,
                "the MLP's width must be a positive multiple of 8, not ", layer.gate_width);
    const int64_t q_width = heads_ * head_dim_;
    LayerProducts products{checked_product(layer.qkv, "q/k/v", width, q_width + 2 * kv_heads_ * head_dim_),
                           checked_product(layer.out, "o_proj", q_width, width),
                           checked_product(layer.gate_up, "gate/up", width, 2 * layer.gate_width),
                           checked_product(layer.down, "down", layer.gate_width, width)};
    if (layer.q_norm.defined()) check_norm(layer.q_norm, head_dim_, "q_norm");
    if (layer.k_norm.defined()) check_norm(layer.k_norm, head_dim_, "k_norm");
    if (layer.attention_out_norm.defined()) check_norm(layer.attention_out_norm, width, "the attention output's norm");
    if (layer.mlp_out_norm.defined()) check_norm(layer.mlp_out_norm, width, "the MLP output's norm");
    return products;
  }

  void check_hidden(const torch::Tensor& hidden, int64_t start) const {
    TORCH_CHECK(hidden.device().is_cpu(), "the compiled layers run on the CPU only, not on ", hidden.device());
    TORCH_CHECK(hidden.dim() == 3 && hidden.size(0) == 1 && hidden.scalar_type() == at::kFloat,
                "hidden must be float32 [1, fed, hidden]");
    TORCH_CHECK(start >= 0, "start must be >= 0, not ", start);
    TORCH_CHECK(layers_.empty() || hidden.size(2) == width_, "hidden is ", hidden.size(2), " wide; the layers take ", width_);
  }

  void check_tables(const torch::Tensor& cos, const torch::Tensor& sin, int64_t fed) const {
    for (const auto& table : {cos, sin})
      TORCH_CHECK(table.device().is_cpu() && (table.dim() == 2 || table.dim() == 3) &&
                  table.scalar_type() == at::kFloat && table.is_contiguous() && table.sizes() == cos.sizes() &&
                  table.size(-2) == fed && table.size(-1) == head_dim_,
                  "cos and sin must be contiguous float32 [fed, head_dim] or [tables, fed, head_dim] on the CPU");
    const int64_t tables = cos.dim() == 3 ? cos.size(0) : 1;
    for (const auto& layer : layers_)
      TORCH_CHECK(layer.rope_table < tables, "a layer takes rotary table ", layer.rope_table, " of ", tables);
  }

  // Each layer's keys and values [kv_heads, capacity, head_dim], with room for rows start..start+fed.
  void check_caches(const std::vector<torch::Tensor>& keys, const std::vector<torch::Tensor>& values, int64_t fed,
                    int64_t start) const {
    TORCH_CHECK(keys.size() == layers_.size() && values.size() == layers_.size(), "one key and value tensor a layer");
    for (size_t i = 0; i < keys.size(); ++i)
      for (const auto& cache : {keys[i], values[i]}) {
        TORCH_CHECK(cache.device().is_cpu() && cache.dim() == 3, "keys and values must be 3-dimensional, on the CPU");
        TORCH_CHECK((cache.scalar_type() == at::kFloat || cache.scalar_type() == torch::kHalf ||
                     cache.scalar_type() == torch::kBFloat16) &&
                    cache.scalar_type() == keys[0].scalar_type() && cache.is_contiguous() && cache.size(0) == kv_heads_ &&
                    cache.size(1) - fed >= start && cache.size(2) == head_dim_,
                    "keys and values must be contiguous float32, float16 or bfloat16 (all alike) [kv_heads, capacity >= start + fed, head_dim]");
      }
  }

  // One decoder layer on state [fed, width], in place; normed and attended are scratch rows.
  void layer(const Layer& layer, const LayerProducts& products, torch::Tensor& state, torch::Tensor& normed, torch::Tensor& attended,
             const torch::Tensor& keys, const torch::Tensor& values, const torch::Tensor& cos,
             const torch::Tensor& sin, int64_t start) {
    const int64_t fed = state.size(0), width = state.size(1);
    float* rows = state.data_ptr<float>();
    rms_norm_rows(rows, layer.input_norm.data_ptr<float>(), fed, width, layer.eps, normed.data_ptr<float>());
    auto qkv = project(products.qkv, layer.qkv.bias, normed);  // [fed, (heads + 2 kv_heads) head_dim]
    const int64_t table = layer.rope_table * fed * head_dim_;  // the layer's rows of cos and sin (check_tables)
    attention(layer, qkv, keys, values, cos.data_ptr<float>() + table, sin.data_ptr<float>() + table, start,
              attended.data_ptr<float>());
    auto out = project(products.out, layer.out.bias, attended);
    norm_rows_in_place(out, layer.attention_out_norm, layer.eps);
    add_rows(rows, width, out.data_ptr<float>(), width, fed, width);
    rms_norm_rows(rows, layer.post_norm.data_ptr<float>(), fed, width, layer.eps, normed.data_ptr<float>());
    const auto gate_up = project(products.gate_up, layer.gate_up.bias, normed);  // [fed, 2·gate_width] (check_layer)
    auto mixed = cpu_tensor({fed, layer.gate_width}, state.scalar_type());
    act_mul_rows(gate_up.data_ptr<float>(), fed, layer.gate_width, gelu_tanh_, mixed.data_ptr<float>());
    auto down = project(products.down, layer.down.bias, mixed);
    norm_rows_in_place(down, layer.mlp_out_norm, layer.eps);
    add_rows(rows, width, down.data_ptr<float>(), width, fed, width);
  }

  // rows [fed, width] RMS-normed by weight, in place; nothing where the weight is undefined.
  static void norm_rows_in_place(torch::Tensor& rows, const torch::Tensor& weight, double eps) {
    if (weight.defined())
      rms_norm_rows(rows.data_ptr<float>(), weight.data_ptr<float>(), rows.size(0), rows.size(1), eps,
                    rows.data_ptr<float>());
  }

  // x [rows, in] → [rows, out] float32: the product (its pointers read by this forward's check_layer), plus the bias.
  torch::Tensor project(const Q4Product& product, const torch::Tensor& bias, const torch::Tensor& x) {
    Stopwatch watch(times_, times_.matmuls);
    torch::Tensor y;
    {
      Stopwatch kernel(times_, times_.kernel);
      y = q4_run(product, x);
    }
    if (bias.defined())  // checked against the parts' widths with the layer (check_layer)
      add_rows(y.data_ptr<float>(), y.size(1), bias.data_ptr<float>(), 0, y.size(0), y.size(1));
    return y;
  }

  // qkv [fed, (heads + 2 kv_heads) head_dim]: norms (where the layer has head norms) and rotates the queries in
  // place, writes the normed, rotated keys and the values into the cache at start.., and attends each query row
  // (causal) into out [fed, heads·head_dim].
  void attention(const Layer& layer, torch::Tensor& qkv, const torch::Tensor& keys, const torch::Tensor& values,
                 const float* cos, const float* sin, int64_t start, float* out) {
    switch (keys.scalar_type()) {
      case torch::kHalf:
        return attention_on(layer, qkv, keys.data_ptr<c10::Half>(), values.data_ptr<c10::Half>(), keys.size(1), cos, sin,
                            start, out);
      case torch::kBFloat16:
        return attention_on(layer, qkv, keys.data_ptr<c10::BFloat16>(), values.data_ptr<c10::BFloat16>(), keys.size(1),
                            cos, sin, start, out);
      default:
        return attention_on(layer, qkv, keys.data_ptr<float>(), values.data_ptr<float>(), keys.size(1), cos, sin, start,
                            out);
    }
  }

  template <typename T>
  void attention_on(const Layer& layer, torch::Tensor& qkv, T* key_cache, T* value_cache, int64_t capacity,
                    const float* cos, const float* sin, int64_t start, float* out) {
    Stopwatch watch(times_, times_.attention);
    const int64_t fed = qkv.size(0), stride = qkv.size(1), dim = head_dim_;
    const int64_t q_width = heads_ * dim, kv_width = kv_heads_ * dim, groups = heads_ / kv_heads_;
    TORCH_CHECK(stride == q_width + 2 * kv_width, "q/k/v are not heads·head_dim wide");
    float* rows = qkv.data_ptr<float>();
    std::vector<float> rotated(dim);
    for (int64_t r = 0; r < fed; ++r) {
      float* row = rows + r * stride;
      const float* c = cos + r * dim;
      const float* s = sin + r * dim;
      norm_heads(row, layer.q_norm, heads_, dim, layer.head_eps);
      norm_heads(row + q_width, layer.k_norm, kv_heads_, dim, layer.head_eps);
      for (int64_t h = 0; h < heads_; ++h) {
        rotate_into(row + h * dim, c, s, dim, rotated.data());
        std::copy(rotated.begin(), rotated.end(), row + h * dim);
      }
      for (int64_t h = 0; h < kv_heads_; ++h) {
        const int64_t slot = (h * capacity + start + r) * dim;
        rotate_into(row + q_width + h * dim, c, s, dim, rotated.data());
        store_row(rotated.data(), dim, key_cache + slot);
        store_row(row + q_width + kv_width + h * dim, dim, value_cache + slot);
      }
    }
    const int64_t room = (start + fed + LANES - 1) / LANES * LANES;
    const int64_t parts = (groups + MAX_HEADS - 1) / MAX_HEADS;  // a key/value head's query heads, ≤ MAX_HEADS at a time
    at::parallel_for(0, fed * kv_heads_ * parts, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> scores(MAX_HEADS * room);
      for (int64_t unit = begin; unit < end; ++unit) {
        const int64_t r = unit / (kv_heads_ * parts), kv = unit / parts % kv_heads_, first = kv * groups + unit % parts * MAX_HEADS;
        const int count = static_cast<int>(std::min<int64_t>(MAX_HEADS, (kv + 1) * groups - first));
        const int64_t last = start + r, oldest = layer.window > 0 ? std::max<int64_t>(0, last + 1 - layer.window) : 0;
        attend_count<T>(count, rows + r * stride + first * dim, key_cache + (kv * capacity + oldest) * dim,
                        value_cache + (kv * capacity + oldest) * dim, last + 1 - oldest, dim, scaling_, softcap_,
                        scores.data(), out + r * q_width + first * dim);
      }
    });
  }

  int64_t heads_, kv_heads_, head_dim_;
  int64_t width_ = 0;  // the layers' hidden width: their first norm's (0 before one is added)
  float scaling_;
  bool gelu_tanh_ = false;  // the MLP's activation: GELU-tanh, else SiLU
  float softcap_ = 0;  // the attention scores' soft-cap; 0: none
  std::vector<Layer> layers_;
  torch::Tensor final_norm_;
  double final_eps_ = 0;
  PartTimes times_;
};

LeanLayers::LeanLayers(int64_t heads, int64_t kv_heads, int64_t head_dim, double scaling)
    : stack_(std::make_unique<LayerStack>(heads, kv_heads, head_dim, scaling)) {}
LeanLayers::~LeanLayers() = default;

void LeanLayers::add_layer(torch::Tensor input_norm, torch::Tensor post_norm, double eps,
                           std::vector<std::vector<torch::Tensor>> qkv, std::optional<torch::Tensor> qkv_bias,
                           std::vector<torch::Tensor> out, std::optional<torch::Tensor> out_bias,
                           std::vector<std::vector<torch::Tensor>> gate_up, std::optional<torch::Tensor> gate_up_bias,
                           int64_t gate_width, std::vector<torch::Tensor> down, std::optional<torch::Tensor> down_bias) {
  stack_->add_layer(std::move(input_norm), std::move(post_norm), eps, std::move(qkv), std::move(qkv_bias), std::move(out),
                    std::move(out_bias), std::move(gate_up), std::move(gate_up_bias), gate_width, std::move(down),
                    std::move(down_bias));
}
void LeanLayers::add_head_norms(torch::Tensor q_norm, torch::Tensor k_norm, double eps) {
  stack_->add_head_norms(std::move(q_norm), std::move(k_norm), eps);
}
void LeanLayers::add_sandwich_norms(torch::Tensor attention_out_norm, torch::Tensor mlp_out_norm) {
  stack_->add_sandwich_norms(std::move(attention_out_norm), std::move(mlp_out_norm));
}
void LeanLayers::set_layer_attention(int64_t window, int64_t rope_table) { stack_->set_layer_attention(window, rope_table); }
void LeanLayers::set_activation(const std::string& name) { stack_->set_activation(name); }
void LeanLayers::set_softcap(double cap) { stack_->set_softcap(cap); }
void LeanLayers::set_final_norm(torch::Tensor weight, double eps) { stack_->set_final_norm(std::move(weight), eps); }
int64_t LeanLayers::size() const { return stack_->size(); }
torch::Tensor LeanLayers::forward(torch::Tensor hidden, const std::vector<torch::Tensor>& keys,
                                  const std::vector<torch::Tensor>& values, const torch::Tensor& cos,
                                  const torch::Tensor& sin, int64_t start) {
  return stack_->forward(std::move(hidden), keys, values, cos, sin, start);
}
torch::Tensor LeanLayers::forward_tail(torch::Tensor hidden, const std::vector<torch::Tensor>& keys,
                                       const std::vector<torch::Tensor>& values, const torch::Tensor& cos,
                                       const torch::Tensor& sin, int64_t start, int64_t keep) {
  return stack_->forward_tail(std::move(hidden), keys, values, cos, sin, start, keep);
}
void LeanLayers::time_parts(bool on) { stack_->time_parts(on); }
std::vector<double> LeanLayers::part_seconds() const { return stack_->part_seconds(); }
