#pragma once
// Evaluation metrics with scikit-learn's and SciPy's definitions, in double precision.
#include <cstdint>
#include <vector>

namespace hone {

struct ClassificationMetrics {
  double accuracy = 0;              // sklearn.metrics.accuracy_score
  double f1 = 0;                    // f1_score(average="macro", zero_division=0)
  double matthews_correlation = 0;  // matthews_corrcoef
};

// predictions[i] and labels[i] are class ids in [0, num_labels). Macro F1 averages over
// the classes that occur in labels or predictions (a class with neither is left out,
// as sklearn does); per class F1 = 2 tp / (2 tp + fp + fn). MCC is sklearn's multi-class
// formula, 0 where its denominator is 0 (e.g. all predictions the same class).
// Empty inputs, different sizes, num_labels < 1 or an id out of range: hone::Error.
ClassificationMetrics classification_metrics(const std::vector<int32_t>& predictions,
                                             const std::vector<int32_t>& labels, int num_labels);

struct RegressionMetrics {
  double mse = 0;       // sklearn.metrics.mean_squared_error
  double pearson = 0;   // scipy.stats.pearsonr(...).statistic
  double spearman = 0;  // scipy.stats.spearmanr(...).statistic (average ranks for ties)
};

// The floats are widened to double before any arithmetic. As in SciPy, pearson and
// spearman are NaN where either input is constant (this includes a single sample) or
// holds a NaN or an infinity; mse then follows IEEE arithmetic.
// Empty inputs or different sizes: hone::Error.
RegressionMetrics regression_metrics(const std::vector<float>& predictions,
                                     const std::vector<float>& labels);

}  // namespace hone
