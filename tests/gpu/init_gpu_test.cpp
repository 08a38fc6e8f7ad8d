// Random weights drawn on the GPU (TrainingRun::init_weights) are the host's, bit for bit,
// and under mixed precision the half-precision copy is those weights rounded.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "hone/cuda.h"
#include "hone/trainer.h"
#include "hone/weights.h"
#include "test_util.h"

namespace hone {
namespace {

TEST(CudaInit, DrawsTheHostsWeights) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  for (bool bf16 : {false, true}) {
    auto be = make_cuda_backend({});
    ModelConfig c = *builtin_config("bert-mini");
    c.pad_token_id = 5;
    TrainingArguments a;
    a.per_device_train_batch_size = 2;
    a.bf16 = bf16;
    TrainingRun run(a, c, 32, *be);
    const ParamLayout& layout = run.model().layout();
    std::vector<float> want(size_t(layout.count())), got(want.size());
    init_weights(c, layout, want.data(), 1234);
    run.init_weights(1234);
    run.read_weights(got.data());
    ASSERT_EQ(got, want) << (bf16 ? "bf16" : "fp32");
    if (!bf16) continue;
    // The bf16 copy the model reads: each weight after the embedding tables (forward reads
    // those from the master weights) rounded to nearest even.
    const Tensor& half = run.model().compute_weights();
    ASSERT_EQ(half.numel(), layout.count() - layout.tables_end());
    std::vector<uint16_t> bits(size_t(half.numel()));
    run.copy_to_host(half, bits.data());
    for (size_t i = 0; i < bits.size(); i += 997) {
      uint32_t u;
      std::memcpy(&u, &want[i + size_t(layout.tables_end())], 4);
      const uint16_t rounded = uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
      ASSERT_EQ(bits[i], rounded) << i;
    }
  }
}

// The streamed save from the device (page-locked pieces, each copy overlapping the last
// piece's write) writes the file a host copy of the weights gives.
TEST(CudaInit, StreamedSaveFromTheDeviceEqualsTheHostSave) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  auto be = make_cuda_backend({});
  const ModelConfig c = *builtin_config("bert-mini");
  TrainingArguments a;
  a.per_device_train_batch_size = 2;
  TrainingRun run(a, c, 32, *be);
  run.init_weights(77);
  std::vector<float> w(size_t(run.model().layout().count()));
  init_weights(c, run.model().layout(), w.data(), 77);
  test::TempDir dir;
  save_pretrained(dir.path + "/host", c, run.model().layout(), w.data());
  run.save_model(dir.path + "/device", 100000);
  auto bytes = [](const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  EXPECT_EQ(bytes(dir.path + "/device/model.safetensors"), bytes(dir.path + "/host/model.safetensors"));
}

}  // namespace
}  // namespace hone
