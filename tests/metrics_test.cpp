#include "hone/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "hone/error.h"

namespace hone {
namespace {

// Every expected value below was printed by the python3 command in the comment next to
// it (scikit-learn 1.9.1, SciPy 1.17.1); f1 is f1_score(average="macro").
constexpr double kTol = 1e-12;

void expect_classification(const std::vector<int32_t>& p, const std::vector<int32_t>& y, int num_labels,
                           double accuracy, double f1, double mcc) {
  const ClassificationMetrics m = classification_metrics(p, y, num_labels);
  EXPECT_NEAR(m.accuracy, accuracy, kTol);
  EXPECT_NEAR(m.f1, f1, kTol);
  EXPECT_NEAR(m.matthews_correlation, mcc, kTol);
}

void expect_regression(const std::vector<float>& p, const std::vector<float>& y, double mse, double pearson,
                       double spearman) {
  const RegressionMetrics m = regression_metrics(p, y);
  EXPECT_NEAR(m.mse, mse, kTol);
  EXPECT_NEAR(m.pearson, pearson, kTol);
  EXPECT_NEAR(m.spearman, spearman, kTol);
}

TEST(MetricsTest, Binary) {
  // python3 -c "from sklearn.metrics import *; p=[0,1,0,0,1,1,1,0,1,0]; y=[0,1,1,0,1,1,0,0,1,1]; print(repr(accuracy_score(y,p)), repr(f1_score(y,p,average='macro',zero_division=0)), repr(matthews_corrcoef(y,p)))"
  // 0.7 0.696969696969697 0.408248290463863
  expect_classification({0, 1, 0, 0, 1, 1, 1, 0, 1, 0}, {0, 1, 1, 0, 1, 1, 0, 0, 1, 1}, 2,  //
                        0.7, 0.696969696969697, 0.408248290463863);
}

TEST(MetricsTest, Multiclass) {
  // python3 -c "from sklearn.metrics import *; p=[0,2,1,0,0,2,1,1,2,2]; y=[0,1,2,0,1,2,0,1,2,2]; print(repr(accuracy_score(y,p)), repr(f1_score(y,p,average='macro',zero_division=0)), repr(matthews_corrcoef(y,p)))"
  // 0.6 0.5833333333333334 0.3939393939393939
  expect_classification({0, 2, 1, 0, 0, 2, 1, 1, 2, 2}, {0, 1, 2, 0, 1, 2, 0, 1, 2, 2}, 3,  //
                        0.6, 0.5833333333333334, 0.3939393939393939);
}

TEST(MetricsTest, ClassNeverPredictedCountsAsZeroF1) {
  // python3 -c "from sklearn.metrics import *; p=[0,1,1,1,1,0]; y=[0,1,2,2,1,0]; print(repr(accuracy_score(y,p)), repr(f1_score(y,p,average='macro',zero_division=0)), repr(matthews_corrcoef(y,p)))"
  // 0.6666666666666666 0.5555555555555555 0.6123724356957946
  expect_classification({0, 1, 1, 1, 1, 0}, {0, 1, 2, 2, 1, 0}, 3,  //
                        0.6666666666666666, 0.5555555555555555, 0.6123724356957946);
}

TEST(MetricsTest, ClassesAbsentFromLabelsAndPredictionsAreLeftOut) {
  // num_labels 4, only classes 0 and 1 occur: the macro average is over those two.
  // python3 -c "from sklearn.metrics import *; p=[0,1,1,1]; y=[0,1,0,1]; print(repr(accuracy_score(y,p)), repr(f1_score(y,p,average='macro',zero_division=0)), repr(matthews_corrcoef(y,p)))"
  // 0.75 0.7333333333333334 0.5773502691896258
  expect_classification({0, 1, 1, 1}, {0, 1, 0, 1}, 4, 0.75, 0.7333333333333334, 0.5773502691896258);
}

TEST(MetricsTest, ClassOnlyPredictedIsIncluded) {
  // python3 -c "from sklearn.metrics import *; p=[0,2,1,1]; y=[0,0,1,1]; print(repr(accuracy_score(y,p)), repr(f1_score(y,p,average='macro',zero_division=0)), repr(matthews_corrcoef(y,p)))"
  // 0.75 0.5555555555555555 0.6708203932499369
  expect_classification({0, 2, 1, 1}, {0, 0, 1, 1}, 3, 0.75, 0.5555555555555555, 0.6708203932499369);
}

TEST(MetricsTest, AllSamePredictionsGiveZeroMcc) {
  // python3 -c "from sklearn.metrics import *; p=[1,1,1,1,1]; y=[0,1,1,0,1]; print(repr(accuracy_score(y,p)), repr(f1_score(y,p,average='macro',zero_division=0)), repr(matthews_corrcoef(y,p)))"
  // 0.6 0.375 0.0
  expect_classification({1, 1, 1, 1, 1}, {0, 1, 1, 0, 1}, 2, 0.6, 0.375, 0.0);
}

TEST(MetricsTest, OneClassEverywhere) {
  // python3 -c "from sklearn.metrics import *; p=[2,2,2]; y=[2,2,2]; print(repr(accuracy_score(y,p)), repr(f1_score(y,p,average='macro',zero_division=0)), repr(matthews_corrcoef(y,p)))"
  // 1.0 1.0 0.0
  expect_classification({2, 2, 2}, {2, 2, 2}, 3, 1.0, 1.0, 0.0);
}

TEST(MetricsTest, PerfectPredictions) {
  expect_classification({0, 1, 2, 1, 0}, {0, 1, 2, 1, 0}, 3, 1.0, 1.0, 1.0);
}

TEST(MetricsTest, ClassificationRejectsBadInput) {
  EXPECT_THROW(classification_metrics({}, {}, 2), Error);
  EXPECT_THROW(classification_metrics({0, 1}, {0}, 2), Error);
  EXPECT_THROW(classification_metrics({0}, {0}, 0), Error);
  try {
    classification_metrics({0, 2}, {0, 1}, 2);
    FAIL() << "expected hone::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("prediction 2 of sample 1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(classification_metrics({0, 1}, {-100, 1}, 2), Error);
}

TEST(MetricsTest, Regression) {
  // python3 -c "import numpy as np; from sklearn.metrics import mean_squared_error as mse; from scipy.stats import pearsonr, spearmanr; p=np.float32([0.5,1.25,2.0,3.5,4.75]).astype(float); y=np.float32([0.0,1.5,2.25,3.0,5.0]).astype(float); print(repr(mse(y,p)), repr(float(pearsonr(p,y)[0])), repr(float(spearmanr(p,y)[0])))"
  // 0.1375 0.9761926628163613 0.9999999999999999
  expect_regression({0.5f, 1.25f, 2.0f, 3.5f, 4.75f}, {0.0f, 1.5f, 2.25f, 3.0f, 5.0f},  //
                    0.1375, 0.9761926628163613, 0.9999999999999999);
}

TEST(MetricsTest, SpearmanAveragesTiedRanks) {
  // python3 -c "import numpy as np; from sklearn.metrics import mean_squared_error as mse; from scipy.stats import pearsonr, spearmanr; p=np.float32([1,2,2,3,3,3,4]).astype(float); y=np.float32([1,1,2,2,3,4,4]).astype(float); print(repr(mse(y,p)), repr(float(pearsonr(p,y)[0])), repr(float(spearmanr(p,y)[0])))"
  // 0.42857142857142855 0.8436614877321077 0.8655446791269229
  expect_regression({1, 2, 2, 3, 3, 3, 4}, {1, 1, 2, 2, 3, 4, 4},  //
                    0.42857142857142855, 0.8436614877321077, 0.8655446791269229);
}

TEST(MetricsTest, RegressionWidensTheFloatsFirst) {
  // python3 -c "import numpy as np; from sklearn.metrics import mean_squared_error as mse; from scipy.stats import pearsonr, spearmanr; p=np.float32([0.1,0.7,-0.3,2.2,1.9,0.05]).astype(float); y=np.float32([0.2,0.6,-0.1,2.5,1.4,0.65]).astype(float); print(repr(mse(y,p)), repr(float(pearsonr(p,y)[0])), repr(float(spearmanr(p,y)[0])))"
  // 0.12666665653387776 0.9338966364565485 0.8285714285714287
  expect_regression({0.1f, 0.7f, -0.3f, 2.2f, 1.9f, 0.05f}, {0.2f, 0.6f, -0.1f, 2.5f, 1.4f, 0.65f},  //
                    0.12666665653387776, 0.9338966364565485, 0.8285714285714287);
}

TEST(MetricsTest, CorrelationsOfConstantOrNanInputAreNan) {
  // scipy.stats.pearsonr / spearmanr return nan for a constant input and propagate NaN.
  RegressionMetrics m = regression_metrics({1, 2, 3}, {4, 4, 4});
  EXPECT_NEAR(m.mse, (9.0 + 4.0 + 1.0) / 3.0, kTol);
  EXPECT_TRUE(std::isnan(m.pearson));
  EXPECT_TRUE(std::isnan(m.spearman));
  m = regression_metrics({1.5f}, {2.0f});
  EXPECT_NEAR(m.mse, 0.25, kTol);
  EXPECT_TRUE(std::isnan(m.pearson));
  EXPECT_TRUE(std::isnan(m.spearman));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  m = regression_metrics({1, nan, 3}, {1, 2, 4});
  EXPECT_TRUE(std::isnan(m.mse));
  EXPECT_TRUE(std::isnan(m.pearson));
  EXPECT_TRUE(std::isnan(m.spearman));
  // An infinity still ranks.
  // python3 -c "import numpy as np; from scipy.stats import spearmanr; print(repr(float(spearmanr([1,2,np.inf,4],[1,3,2,5])[0])))"
  // 0.39999999999999997
  m = regression_metrics({1, 2, std::numeric_limits<float>::infinity(), 4}, {1, 3, 2, 5});
  EXPECT_TRUE(std::isnan(m.pearson));
  EXPECT_NEAR(m.spearman, 0.39999999999999997, kTol);
}

TEST(MetricsTest, RegressionRejectsBadInput) {
  EXPECT_THROW(regression_metrics({}, {}), Error);
  EXPECT_THROW(regression_metrics({1, 2}, {1}), Error);
}

}  // namespace
}  // namespace hone
