#include "hone/metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "hone/error.h"

namespace hone {
namespace {

template <typename A, typename B>
void check_sizes(const char* what, const std::vector<A>& predictions, const std::vector<B>& labels) {
  if (predictions.empty() || labels.empty()) fail("{}: no samples to evaluate", what);
  if (predictions.size() != labels.size())
    fail("{}: {} predictions for {} labels", what, predictions.size(), labels.size());
}

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// scipy.stats.pearsonr's statistic: centred vectors, r = <xm, ym> / (|xm| |ym|), clipped
// to [-1, 1]; NaN for a constant input; rounded to +-1 for two samples.
double pearson(const std::vector<double>& x, const std::vector<double>& y) {
  const size_t n = x.size();
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i]) || !std::isfinite(y[i])) return kNaN;
  const bool const_x = std::all_of(x.begin(), x.end(), [&](double v) { return v == x[0]; });
  const bool const_y = std::all_of(y.begin(), y.end(), [&](double v) { return v == y[0]; });
  if (const_x || const_y) return kNaN;  // also n == 1
  const double mx = std::accumulate(x.begin(), x.end(), 0.0) / double(n);
  const double my = std::accumulate(y.begin(), y.end(), 0.0) / double(n);
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < n; ++i) {
    const double dx = x[i] - mx, dy = y[i] - my;
    sxy += dx * dy;
    sxx += dx * dx;
    syy += dy * dy;
  }
  double r = sxy / (std::sqrt(sxx) * std::sqrt(syy));
  r = std::clamp(r, -1.0, 1.0);
  if (n == 2) r = std::round(r);
  return r;
}

// scipy.stats.rankdata(method="average"): ranks from 1, ties get the mean of their ranks.
std::vector<double> average_ranks(const std::vector<double>& v) {
  const size_t n = v.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return v[a] < v[b]; });
  std::vector<double> rank(n);
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j + 1 < n && v[order[j + 1]] == v[order[i]]) ++j;
    const double r = (double(i + 1) + double(j + 1)) / 2.0;  // mean of ranks i+1 .. j+1
    for (size_t k = i; k <= j; ++k) rank[order[k]] = r;
    i = j + 1;
  }
  return rank;
}

}  // namespace

ClassificationMetrics classification_metrics(const std::vector<int32_t>& predictions,
                                             const std::vector<int32_t>& labels, int num_labels) {
  check_sizes("classification metrics", predictions, labels);
  if (num_labels < 1) fail("classification metrics: num_labels must be at least 1, got {}", num_labels);
  const size_t n = labels.size();
  const size_t k = size_t(num_labels);
  // confusion[t * k + p]: samples of true class t predicted as p.
  std::vector<int64_t> confusion(k * k, 0);
  for (size_t i = 0; i < n; ++i) {
    if (labels[i] < 0 || labels[i] >= num_labels)
      fail("classification metrics: label {} of sample {} is outside [0, {})", labels[i], i, num_labels);
    if (predictions[i] < 0 || predictions[i] >= num_labels)
      fail("classification metrics: prediction {} of sample {} is outside [0, {})", predictions[i], i,
           num_labels);
    ++confusion[size_t(labels[i]) * k + size_t(predictions[i])];
  }
  std::vector<int64_t> true_sum(k, 0), pred_sum(k, 0);
  int64_t correct = 0;
  for (size_t t = 0; t < k; ++t)
    for (size_t p = 0; p < k; ++p) {
      true_sum[t] += confusion[t * k + p];
      pred_sum[p] += confusion[t * k + p];
    }
  for (size_t c = 0; c < k; ++c) correct += confusion[c * k + c];

  ClassificationMetrics m;
  m.accuracy = double(correct) / double(n);

  // f1_score(average="macro"): F = (1 + b^2) tp / (b^2 true_sum + pred_sum), b = 1, over
  // the classes in labels ∪ predictions (their denominators are never 0).
  double f1_total = 0;
  int present = 0;
  for (size_t c = 0; c < k; ++c) {
    if (true_sum[c] == 0 && pred_sum[c] == 0) continue;
    f1_total += 2.0 * double(confusion[c * k + c]) / (double(true_sum[c]) + double(pred_sum[c]));
    ++present;
  }
  m.f1 = f1_total / double(present);

  // matthews_corrcoef, in float64 as sklearn computes it.
  const double samples = double(n);
  double t_dot_p = 0, p_dot_p = 0, t_dot_t = 0;
  for (size_t c = 0; c < k; ++c) {
    t_dot_p += double(true_sum[c]) * double(pred_sum[c]);
    p_dot_p += double(pred_sum[c]) * double(pred_sum[c]);
    t_dot_t += double(true_sum[c]) * double(true_sum[c]);
  }
  const double cov_ytyp = double(correct) * samples - t_dot_p;
  const double cov_ypyp = samples * samples - p_dot_p;
  const double cov_ytyt = samples * samples - t_dot_t;
  const double denom = cov_ypyp * cov_ytyt;
  m.matthews_correlation = denom == 0 ? 0.0 : cov_ytyp / std::sqrt(denom);
  return m;
}

RegressionMetrics regression_metrics(const std::vector<float>& predictions, const std::vector<float>& labels) {
  check_sizes("regression metrics", predictions, labels);
  const size_t n = labels.size();
  std::vector<double> x(predictions.begin(), predictions.end()), y(labels.begin(), labels.end());
  RegressionMetrics m;
  double se = 0;
  for (size_t i = 0; i < n; ++i) se += (y[i] - x[i]) * (y[i] - x[i]);
  m.mse = se / double(n);
  m.pearson = pearson(x, y);
  // spearmanr: the Pearson correlation of the average ranks. A NaN propagates (scipy's
  // default nan_policy); infinities rank like any other value.
  const auto has_nan = [](const std::vector<double>& v) {
    return std::any_of(v.begin(), v.end(), [](double e) { return std::isnan(e); });
  };
  m.spearman = has_nan(x) || has_nan(y) ? kNaN : pearson(average_ranks(x), average_ranks(y));
  return m;
}

}  // namespace hone
