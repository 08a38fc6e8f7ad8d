// prepare_cuda (hone/cuda.h) on a real GPU: the cuBLASLt handle it readies goes to the next
// backend of its device, once, and that backend's products are bit for bit those of a
// backend made without it (but for F32's bias gradient, whose sums are added atomically);
// without a GPU it ends quietly. And TrainingRun::warm_up_inference: after it, no batch a
// server runs times its products; a backend that does not time products (CudaOptions'
// default: hone predict, short training runs) times none and warms up nothing.
#include <cublasLt.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/warm_start.h"
#include "device_tensor.h"
#include "gpu/small_bert.h"
#include "hone/cuda.h"
#include "hone/error.h"
#include "hone/trainer.h"
#include "hone/weights.h"
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
  for (const PreparedWork work : {PreparedWork::Training, PreparedWork::Inference}) {
    prepare_cuda(0, DType::BF16, false, work);
    EXPECT_EQ(cuda::take_prepared_lt(1), nullptr);  // prepared for device 0 only
    cublasLtHandle_t lt = cuda::take_prepared_lt(0);
    ASSERT_NE(lt, nullptr);
    EXPECT_EQ(cuda::take_prepared_lt(0), nullptr);  // taken
    EXPECT_EQ(cublasLtDestroy(lt), CUBLAS_STATUS_SUCCESS);
  }
}

TEST_F(WarmStart, ABackendAfterPreparationComputesTheSameProducts) {
  constexpr int M = 64, K = 256, N = 128;
  const HostTensor x = test::random({M, K}, 1), w = test::random({N, K}, 2), b = test::random({N}, 3),
                   dy = test::random({M, N}, 4);
  constexpr int kParts = 2;
  for (const DType t : {DType::BF16, DType::F16, DType::F32}) {
    // y = x w^T + b, then dx, dw and db, and y's parts over halves of k, on a fresh backend.
    auto products = [&](bool prepared, PreparedWork work) {
      if (prepared) prepare_cuda(0, t, false, work);
      std::unique_ptr<Backend> g = make_cuda_backend({});
      std::vector<std::vector<float>> out;
      {
        DeviceTensor gx(*g, t, x), gw(*g, t, w), gb(*g, t, b), gdy(*g, t, dy);
        DeviceTensor gy(*g, t, Shape{M, N}), gdx(*g, t, Shape{M, K}), gparts(*g, DType::F32, Shape{kParts, M, N});
        DeviceTensor gdw(*g, DType::F32, test::filled({N, K}, 0)), gdb(*g, DType::F32, test::filled({N}, 0));
        g->linear_forward(gx.t, gw.t, &gb.t, gy.t);
        g->linear_backward(gdy.t, gx.t, gw.t, &gdx.t, false, gdw.t, &gdb.t);
        g->linear_split_forward(gx.t, gw.t, gparts.t);
        for (const DeviceTensor* d : {&gy, &gdx, &gdw, &gdb, &gparts}) out.push_back(d->download());
      }
      return out;
    };
    const std::vector<std::vector<float>> plain = products(false, PreparedWork::Training);
    for (const PreparedWork work : {PreparedWork::Training, PreparedWork::Inference}) {
      const std::vector<std::vector<float>> prepared = products(true, work);
      const char* names[] = {"y", "dx", "dw", "db", "parts"};
      for (size_t i = 0; i < plain.size(); ++i) {
        // F32's bias gradient is a column-sum kernel whose blocks add their bands atomically,
        // in an order that varies from run to run (the two backends' sums differed on an H200).
        if (t == DType::F32 && std::string(names[i]) == "db") {
          ASSERT_EQ(plain[i].size(), prepared[i].size());
          for (size_t j = 0; j < plain[i].size(); ++j)
            EXPECT_NEAR(plain[i][j], prepared[i][j], 1e-6 * (1 + std::fabs(plain[i][j]))) << "db[" << j << "] in F32";
          continue;
        }
        EXPECT_EQ(plain[i], prepared[i])
            << names[i] << " in " << dtype_name(t) << ", prepared for "
            << (work == PreparedWork::Training ? "training" : "inference");
      }
    }
  }
  EXPECT_EQ(cuda::take_prepared_lt(0), nullptr);  // each backend took its handle
}

// `count` batches of up to 8 rows of random lengths (right-padded, so packed), logits only.
void infer_random_batches(TrainingRun& run, const ModelConfig& c, int count) {
  constexpr int kSeq = 128, kBatch = 8;
  std::mt19937 g(5);
  std::uniform_int_distribution<int> rows(1, kBatch), length(1, kSeq);
  for (int i = 0; i < count; ++i) {
    const int n = rows(g);
    std::vector<int32_t> ids(size_t(n) * kSeq, 0), mask(ids.size(), 0), types(ids.size(), 0);
    for (int r = 0; r < n; ++r) {
      const int len = length(g);
      for (int t = 0; t < len; ++t) {
        ids[size_t(r) * kSeq + size_t(t)] = 5 + (r * 31 + t * 7) % 500;
        mask[size_t(r) * kSeq + size_t(t)] = 1;
      }
    }
    std::vector<float> logits(size_t(n) * size_t(c.num_labels));
    run.infer(Batch{n, kSeq, ids.data(), mask.data(), types.data(), nullptr, {}}, ForwardOutputs{logits.data()});
  }
}

// A bf16 inference run of bert-large's layer (its up projection is timed from 256 rows), one
// of it, 128 positions, batches up to 8, random weights.
struct LargeLayerRun {
  ModelConfig c = [] {
    ModelConfig c = test::small_bert();
    c.hidden_size = 1024;
    c.intermediate_size = 4096;
    c.num_attention_heads = 16;
    c.num_hidden_layers = 1;
    c.max_position_embeddings = 128;
    return c;
  }();
  std::unique_ptr<Backend> be;
  std::unique_ptr<TrainingRun> run;

  explicit LargeLayerRun(const CudaOptions& options) : be(make_cuda_backend(options)) {
    TrainingArguments a;
    a.bf16 = true;
    run = std::make_unique<TrainingRun>(a, c, 128, *be, GradientMemory::Persistent, RunPhases{false, 8});
    const ParamLayout layout(c);
    std::vector<float> w(size_t(layout.count()));
    init_weights(c, layout, w.data(), 1);
    run->write_weights(w.data());
  }
  const CudaBackend& cuda() const { return dynamic_cast<const CudaBackend&>(*be); }
};

// A server's batches after the warm-up: right-padded rows of any lengths, packed, find each
// product's algorithm chosen (timing candidates would hold up a request for milliseconds).
TEST_F(WarmStart, AfterTheWarmUpNoInferenceBatchTimesItsProducts) {
  std::string why;
  if (!mixed_precision_available(&why)) GTEST_SKIP() << "no mixed precision: " << why;
  LargeLayerRun r({.time_products = true});
  // The quarter-octave groups from 256 rows (4096 x 1024 x 256 multiply-adds: 2^30) to 1024.
  EXPECT_EQ(r.run->warm_up_inference(), (std::vector<int64_t>{256, 320, 384, 448, 512, 640, 768, 896, 1024}));
  const size_t timed = r.cuda().timed_product_groups();
  EXPECT_GT(timed, 0u);
  infer_random_batches(*r.run, r.c, 40);
  EXPECT_EQ(r.cuda().timed_product_groups(), timed) << "a batch after the warm-up timed a product";
}

TEST_F(WarmStart, ABackendThatDoesNotTimeProductsTimesNone) {
  std::string why;
  if (!mixed_precision_available(&why)) GTEST_SKIP() << "no mixed precision: " << why;
  LargeLayerRun r({});
  EXPECT_TRUE(r.run->warm_up_inference().empty());
  infer_random_batches(*r.run, r.c, 40);  // up to 1024 rows: products the other backend times
  EXPECT_EQ(r.cuda().timed_product_groups(), 0u);
}

// Without a usable GPU (CI's machines), the preparation is best effort: it ends quietly,
// prepares no handle, and the backend's own creation reports what is missing.
TEST(WarmStartWithoutGpu, EndsQuietlyAndLeavesTheErrorToTheBackend) {
  std::string why;
  if (cuda_available(&why)) GTEST_SKIP() << "a GPU is usable here: the case needs a machine without one";
  EXPECT_NO_THROW(prepare_cuda(0, DType::BF16, false, PreparedWork::Training));
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
