// prepare_cuda (hone/cuda.h) on a real GPU: the cuBLASLt handle it readies goes to the next
// backend of its device, once, and that backend's products are bit for bit those of a
// backend made without it (but for F32's bias gradient, whose sums are added atomically);
// without a GPU it ends quietly.
#include <cublasLt.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "cuda/warm_start.h"
#include "device_tensor.h"
#include "hone/cuda.h"
#include "hone/error.h"
#include "test_util.h"

namespace hone {
namespace {

using test::DeviceTensor;
using test::HostTensor;

class WarmStart : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  }
};

TEST_F(WarmStart, ThePreparedHandleGoesOnceToItsDevice) {
  prepare_cuda(0, DType::BF16, false);
  EXPECT_EQ(cuda::take_prepared_lt(1), nullptr);  // prepared for device 0 only
  cublasLtHandle_t lt = cuda::take_prepared_lt(0);
  ASSERT_NE(lt, nullptr);
  EXPECT_EQ(cuda::take_prepared_lt(0), nullptr);  // taken
  EXPECT_EQ(cublasLtDestroy(lt), CUBLAS_STATUS_SUCCESS);
}

TEST_F(WarmStart, ABackendAfterPreparationComputesTheSameProducts) {
  constexpr int M = 64, K = 256, N = 128;
  const HostTensor x = test::random({M, K}, 1), w = test::random({N, K}, 2), b = test::random({N}, 3),
                   dy = test::random({M, N}, 4);
  for (const DType t : {DType::BF16, DType::F16, DType::F32}) {
    // y = x w^T + b, then dx, dw and db, on a fresh backend.
    auto products = [&](bool prepared) {
      if (prepared) prepare_cuda(0, t, false);
      std::unique_ptr<Backend> g = make_cuda_backend({});
      std::vector<std::vector<float>> out;
      {
        DeviceTensor gx(*g, t, x), gw(*g, t, w), gb(*g, t, b), gdy(*g, t, dy);
        DeviceTensor gy(*g, t, Shape{M, N}), gdx(*g, t, Shape{M, K});
        DeviceTensor gdw(*g, DType::F32, test::filled({N, K}, 0)), gdb(*g, DType::F32, test::filled({N}, 0));
        g->linear_forward(gx.t, gw.t, &gb.t, gy.t);
        g->linear_backward(gdy.t, gx.t, gw.t, &gdx.t, false, gdw.t, &gdb.t);
        for (const DeviceTensor* d : {&gy, &gdx, &gdw, &gdb}) out.push_back(d->download());
      }
      return out;
    };
    const std::vector<std::vector<float>> plain = products(false), prepared = products(true);
    const char* names[] = {"y", "dx", "dw", "db"};
    for (size_t i = 0; i < plain.size(); ++i) {
      // F32's bias gradient is a column-sum kernel whose blocks add their bands atomically,
      // in an order that varies from run to run (the two backends' sums differed on an H200).
      if (t == DType::F32 && std::string(names[i]) == "db") {
        ASSERT_EQ(plain[i].size(), prepared[i].size());
        for (size_t j = 0; j < plain[i].size(); ++j)
          EXPECT_NEAR(plain[i][j], prepared[i][j], 1e-6 * (1 + std::fabs(plain[i][j]))) << "db[" << j << "] in F32";
        continue;
      }
      EXPECT_EQ(plain[i], prepared[i]) << names[i] << " in " << dtype_name(t);
    }
  }
  EXPECT_EQ(cuda::take_prepared_lt(0), nullptr);  // each backend took its handle
}

// Without a usable GPU (CI's machines), the preparation is best effort: it ends quietly,
// prepares no handle, and the backend's own creation reports what is missing.
TEST(WarmStartWithoutGpu, EndsQuietlyAndLeavesTheErrorToTheBackend) {
  std::string why;
  if (cuda_available(&why)) GTEST_SKIP() << "a GPU is usable here: the case needs a machine without one";
  EXPECT_NO_THROW(prepare_cuda(0, DType::BF16, false));
  EXPECT_EQ(cuda::take_prepared_lt(0), nullptr);
  try {
    make_cuda_backend({});
    ADD_FAILURE() << "make_cuda_backend made a backend without a usable GPU";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--device cuda"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hone
