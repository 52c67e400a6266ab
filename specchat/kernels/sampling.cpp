// Logits → sampling probabilities in one pass over each row: what specchat/speculative/sampling.py's
// probs_from_logits computes in torch (temperature, top-k, top-p, the same kept tokens), without its
// ten passes over a 152k-wide row. A sampled step calls it on the verified rows and on every drafted
// token's row.
//
// Per row: e = exp((x − max) / T) (simd.h: 0 below about e^-87.3, where torch keeps a subnormal); top-k keeps
// the e from the k-th largest up; top-p keeps the most likely tokens until the mass before the next reaches
// top_p, and every token tied with the last one kept; the kept e's, over their sum, are the probabilities,
// the rest 0. The nucleus is looked for among the tokens of probability ≥ 1e-4 first (far fewer than 152k),
// among more only when it reaches past them. Sums run in float lanes within runs of 512 entries, in double
// across them.
//
// greedy_rows: each row's argmax as torch's argmax gives it (the first of equal maxima) and its log-sum-exp, in two
// passes over the row instead of torch's six: what a greedy step needs for its verdict and each token's p (/why).
// A row holding a NaN or an infinity takes a plain loop with torch's rules (a NaN is the largest, and makes the sum
// NaN; +inf makes it inf; all -inf gives -inf).
//
// A row with no finite largest logit (one holding +inf, or all -inf) or holding a NaN gives NaN probabilities,
// as the torch code does (its best − best is inf − inf there, and its softmax NaN): no token is picked from it as
// if it were a law (every e would be 0, and the nucleus of nothing has no last token).
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "q4/q4_kernel.h"
#include "simd.h"

namespace {

constexpr int64_t RUN = 512;  // entries summed in float lanes before the run's sum joins a double total

// Σ f(i) over [0, width), f giving 8 entries at a time (plain floats past the last whole 8): float lanes within a
// run of RUN entries, the runs' sums in double, so 152k entries sum within about 1e-7 of their value.
template <typename Lanes, typename One>
double sum_in_runs(int64_t width, Lanes lanes, One one) {
  double total = 0;
  int64_t i = 0;
  while (i + simd::LANES <= width) {
    simd::F8 sums = simd::splat(0.0f);
    for (const int64_t end = std::min(width, i + RUN); i + simd::LANES <= end; i += simd::LANES) sums = sums + lanes(i);
    total += simd::lane_sum(sums);
  }
  for (; i < width; ++i) total += one(i);
  return total;
}

// e^((x − best) / T) of every entry into e (best: the row's largest x, finite); returns their sum, at least 1.
double exp_row(const float* x, int64_t width, float best, float temperature, float* e) {
  const simd::F8 shift = simd::splat(best), divisor = simd::splat(temperature);
  return sum_in_runs(
      width,
      [&](int64_t i) {
        const simd::F8 v = simd::exp((simd::load(x + i) - shift) / divisor);
        simd::store(e + i, v);
        return v;
      },
      [&](int64_t i) { return e[i] = std::exp((x[i] - best) / temperature); });
}

// Zero every e below `least`; returns the sum of what is left.
double keep_from(float least, int64_t width, float* e) {
  const simd::F8 floor = simd::splat(least);
  return sum_in_runs(
      width,
      [&](int64_t i) {
        const simd::F8 kept = simd::keep_where_at_least(simd::load(e + i), floor);
        simd::store(e + i, kept);
        return kept;
      },
      [&](int64_t i) { return e[i] = e[i] < least ? 0.0f : e[i]; });
}

// The k-th largest e (top-k keeps e from it up; exp never reorders).
float kth_largest(const float* e, int64_t width, int64_t k) {
  std::vector<float> copy(e, e + width);
  std::nth_element(copy.begin(), copy.begin() + (k - 1), copy.end(), std::greater<float>());
  return copy[k - 1];
}

// The e of the last token the nucleus keeps: the most likely tokens until the mass before the next reaches
// top_p (at least one). Looked for among the e ≥ cut·total, the cut lowered while the nucleus reaches past them.
float nucleus_least(const float* e, int64_t width, double total, double top_p) {
  std::vector<float> top;
  for (double cut = 1e-4;; cut *= 1e-3) {
    const bool everything = cut < 1e-30;
    const float least = static_cast<float>(cut * total);
    top.clear();
    for (int64_t i = 0; i < width; ++i)
      if (e[i] > 0 && (everything || e[i] >= least)) top.push_back(e[i]);
    std::sort(top.begin(), top.end(), std::greater<float>());
    double before = 0;  // the mass of the tokens more likely than top[kept]
    size_t kept = 0;
    while (kept < top.size() && (kept == 0 || before < top_p)) before += top[kept++] / total;
    if (kept < top.size() || everything || before >= top_p) return top[kept - 1];
  }
}

void row_probs(const float* x, int64_t width, float temperature, int64_t top_k, double top_p, float* out) {
  float best = -std::numeric_limits<float>::infinity();
  bool nan = false;
  for (int64_t i = 0; i < width; ++i) {
    best = std::max(best, x[i]);
    nan = nan || std::isnan(x[i]);
  }
  if (nan || !std::isfinite(best)) {  // as the torch code: all NaN (see the top of this file)
    std::fill(out, out + width, std::numeric_limits<float>::quiet_NaN());
    return;
  }
  double total = exp_row(x, width, best, temperature, out);
  if (top_k > 0 && top_k < width) total = keep_from(kth_largest(out, width, top_k), width, out);
  if (top_p < 1.0) total = keep_from(nucleus_least(out, width, total, top_p), width, out);
  const float inverse = static_cast<float>(1.0 / total);
  int64_t i = 0;
  for (; i + simd::LANES <= width; i += simd::LANES) simd::store(out + i, simd::load(out + i) * simd::splat(inverse));
  for (; i < width; ++i) out[i] *= inverse;
}

}  // namespace

torch::Tensor top_p_probs(torch::Tensor logits, double temperature, int64_t top_k, double top_p) {
  TORCH_CHECK(logits.device().is_cpu() && logits.dim() == 2 && logits.scalar_type() == at::kFloat,
              "logits must be float32 [rows, vocab] on the CPU");
  TORCH_CHECK(temperature > 0 && std::isfinite(temperature) && top_p > 0 && top_p <= 1 && top_k >= 0,
              "temperature > 0, top_p in (0, 1], top_k >= 0 (temperature finite): not ", temperature, ", ", top_p, ", ", top_k);
  TORCH_CHECK(logits.size(1) > 0, "logits must be at least one token wide");
  auto input = logits.contiguous();
  auto out = cpu_tensor(input.sizes(), input.scalar_type());
  const int64_t rows = input.size(0), width = input.size(1);
  const float* x = input.data_ptr<float>();
  float* probs = out.data_ptr<float>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      row_probs(x + r * width, width, static_cast<float>(temperature), top_k, top_p, probs + r * width);
  });
  return out;
}

namespace {

constexpr int64_t EXACT_INDEX = int64_t{1} << 24;  // floats hold every whole number below this exactly
constexpr int64_t SPAN = 16384;  // entries of a row a thread takes at a time: fixed, so no sum depends on the threads

// A span's largest entry, the first index holding it, and whether every entry is finite.
struct Peak {
  float best;
  int64_t at;
  bool finite;
};

// The Peak of x [width]: each lane keeps the first index of its largest (a later entry replaces it only when strictly
// larger), then the lanes holding the largest give the least of their indices. Indices ride in float lanes, exact
// below EXACT_INDEX; x − x is 0 for a finite entry and NaN for any other, so one sum tells whether all are finite.
Peak span_peak(const float* x, int64_t width) {
  const float lowest = -std::numeric_limits<float>::infinity();
  float start[simd::LANES];
  for (int l = 0; l < simd::LANES; ++l) start[l] = static_cast<float>(l);
  simd::F8 best = simd::splat(lowest), where = simd::splat(0.0f), index = simd::load(start), odd = simd::splat(0.0f);
  int64_t i = 0;
  for (; i + simd::LANES <= width; i += simd::LANES) {
    const simd::F8 v = simd::load(x + i);
    where = simd::select_less(best, v, index, where);
    best = simd::greater(best, v);
    odd = odd + (v - v);
    index = index + simd::splat(static_cast<float>(simd::LANES));
  }
  float lane_best[simd::LANES], lane_where[simd::LANES];
  simd::store(lane_best, best);
  simd::store(lane_where, where);
  Peak peak{lowest, width, simd::lane_sum(odd) == 0.0f};
  for (int l = 0; l < simd::LANES; ++l) {
    const auto found = static_cast<int64_t>(lane_where[l]);
    if (lane_best[l] > peak.best || (lane_best[l] == peak.best && found < peak.at)) peak.best = lane_best[l], peak.at = found;
  }
  for (; i < width; ++i) {
    peak.finite = peak.finite && std::isfinite(x[i]);
    if (x[i] > peak.best) peak.best = x[i], peak.at = i;
  }
  return peak;
}

// torch's argmax and logsumexp of a row holding a NaN or an infinity, entry by entry.
void greedy_row_plainly(const float* x, int64_t width, int64_t* id, float* total) {
  int64_t at = 0;
  for (int64_t i = 1; i < width && !std::isnan(x[at]); ++i)
    if (std::isnan(x[i]) || x[i] > x[at]) at = i;
  *id = at;
  const float best = x[at];
  if (std::isnan(best) || std::isinf(best)) {  // NaN, +inf, or a row all -inf
    *total = best;
    return;
  }
  double sum = 0;
  for (int64_t i = 0; i < width; ++i) sum += std::exp(static_cast<double>(x[i]) - best);
  *total = static_cast<float>(best + std::log(sum));
}

double span_exp_sum(const float* x, int64_t width, float best) {
  const simd::F8 shift = simd::splat(best);
  return sum_in_runs(
      width, [&](int64_t i) { return simd::exp(simd::load(x + i) - shift); },
      [&](int64_t i) { return std::exp(x[i] - best); });
}

// The spans' peaks of a row, in order, as one: the largest, its first index, all finite.
Peak row_peak(const Peak* peaks, int64_t spans) {
  Peak row = peaks[0];
  for (int64_t s = 1; s < spans; ++s) {
    if (peaks[s].best > row.best) row.best = peaks[s].best, row.at = peaks[s].at;
    row.finite = row.finite && peaks[s].finite;
  }
  return row;
}

}  // namespace

std::vector<torch::Tensor> greedy_rows(torch::Tensor logits) {
  TORCH_CHECK(logits.device().is_cpu() && logits.dim() == 2 && logits.scalar_type() == at::kFloat,
              "logits must be float32 [rows, vocab] on the CPU");
  TORCH_CHECK(logits.size(1) > 0 && logits.size(1) < EXACT_INDEX, "logits must be 1 to 2^24 - 1 tokens wide");
  auto input = logits.contiguous();
  const int64_t rows = input.size(0), width = input.size(1), spans = (width + SPAN - 1) / SPAN;
  auto ids = cpu_tensor({rows}, torch::kLong);
  auto totals = cpu_tensor({rows}, at::kFloat);
  const float* x = input.data_ptr<float>();
  int64_t* id = ids.data_ptr<int64_t>();
  float* total = totals.data_ptr<float>();
  const auto span_of = [&](int64_t job) {  // job: row job / spans, its span job % spans → (first entry, entries)
    const int64_t first = job % spans * SPAN;
    return std::pair{x + job / spans * width + first, std::min(SPAN, width - first)};
  };
  std::vector<Peak> peaks(rows * spans);
  at::parallel_for(0, rows * spans, 1, [&](int64_t begin, int64_t end) {
    for (int64_t job = begin; job < end; ++job) {
      const auto [start, count] = span_of(job);
      peaks[job] = span_peak(start, count);
      peaks[job].at += job % spans * SPAN;
    }
  });
  std::vector<Peak> best(rows);
  for (int64_t r = 0; r < rows; ++r) best[r] = row_peak(peaks.data() + r * spans, spans);
  std::vector<double> sums(rows * spans, 0.0);
  at::parallel_for(0, rows * spans, 1, [&](int64_t begin, int64_t end) {
    for (int64_t job = begin; job < end; ++job) {
      const auto [start, count] = span_of(job);
      if (best[job / spans].finite) sums[job] = span_exp_sum(start, count, best[job / spans].best);
    }
  });
  for (int64_t r = 0; r < rows; ++r) {
    if (!best[r].finite) {
      greedy_row_plainly(x + r * width, width, id + r, total + r);
      continue;
    }
    double sum = 0;
    for (int64_t s = 0; s < spans; ++s) sum += sums[r * spans + s];
    id[r] = best[r].at;
    total[r] = static_cast<float>(best[r].best + std::log(sum));
  }
  return {ids, totals};
}
