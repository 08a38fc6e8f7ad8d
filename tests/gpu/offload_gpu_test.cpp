// --offload_optimizer on a GPU: the update on the host equals the update on the device up to
// the device kernel's rounding, in fp32, bf16 and fp16, and the device holds no master
// weights or optimizer state.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "gpu/small_bert.h"
#include "hone/cpu_backend.h"
#include "hone/cuda.h"
#include "hone/ops.h"
#include "hone/trainer.h"
#include "hone/weights.h"
#include "test_util.h"

namespace hone {
namespace {

double rel_frobenius(const std::vector<float>& got, const std::vector<float>& want) {
  return test::norm_rel_error(got.data(), want.data(), int64_t(want.size()));
}

TEST(OffloadGpu, EqualsTheUpdateOnTheGpu) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  auto be = make_cuda_backend({});
  const ModelConfig c = test::small_bert();
  const ParamLayout layout(c);
  std::vector<float> w0(size_t(layout.count()));
  init_weights(c, layout, w0.data(), 11);
  for (const char* optim : {"adamw_torch", "adafactor"})
    for (DType t : {DType::F32, DType::BF16, DType::F16}) {
      if (t != DType::F32 && !mixed_precision_available(nullptr)) continue;
      auto train = [&](bool offload, double& loss, Backend* on = nullptr) {
        TrainingArguments a;
        a.per_device_train_batch_size = 4;
        a.gradient_accumulation_steps = 2;
        a.max_grad_norm = 0.5;
        a.weight_decay = 0.01;
        a.optim = optim;
        a.bf16 = t == DType::BF16;
        a.fp16 = t == DType::F16;
        a.offload_optimizer = offload;
        TrainingRun run(a, c, 64, on ? *on : *be, gradient_memory_for(a));
        if (a.fp16) run.set_scaler_state({256.0, 0, 0});
        run.write_weights(w0.data());
        std::mt19937 g(5);
        loss = 0;
        for (int update = 1; update <= 3; ++update) {
          for (int micro = 0; micro < 2; ++micro) {
            const test::TaskBatch b = test::random_batch(g, 4, 64, c.vocab_size);
            run.micro_step(b.ids.data(), b.mask.data(), b.types.data(), b.labels.data(), 4, 0.5f,
                           uint64_t(2 * update + micro));
          }
          run.optimizer_step(1e-3, update);
          loss += run.take_loss_sum();
        }
        std::vector<float> w(w0.size());
        run.read_weights(w.data());
        return w;
      };
      double loss_gpu = 0, loss_host = 0;
      const std::vector<float> on_gpu = train(false, loss_gpu), on_host = train(true, loss_host);
      const double err = rel_frobenius(on_host, on_gpu), moved = rel_frobenius(on_gpu, w0);
      // How far two runs on the GPU alone are apart: fp32 Adafactor divides by the root of a
      // second moment floored at 1e-30 (not Adam's 1e-8 beside it), so the last bits of
      // near-zero gradients, which the GPU's fp32 backward sums in an order that can vary
      // from run to run, reach the update.
      double again_loss = 0;
      const double run_to_run = rel_frobenius(train(false, again_loss), on_gpu);
      if (t == DType::F32) {  // both against the CPU reference end to end
        CpuBackend cpu;
        double loss_cpu = 0;
        const std::vector<float> ref = train(false, loss_cpu, &cpu);
        const double gpu_err = rel_frobenius(on_gpu, ref), host_err = rel_frobenius(on_host, ref);
        std::printf("[%s F32] against the CPU: on the GPU %.2e, offloaded %.2e; GPU run to run %.2e\n", optim, gpu_err,
                    host_err, run_to_run);
        // Offloading adds no error of its own: the offloaded run is as close to the CPU's as
        // the run on the GPU is.
        EXPECT_LT(host_err, 2 * gpu_err + 1e-7) << optim;
      }
      // fp32: the GPU kernel's fused multiply-adds against the host's separate roundings,
      // a few ulps of each update; under mixed precision a rounded weight that lands on the
      // other side of a bf16/fp16 step changes the next gradients at that format's precision.
      EXPECT_LT(err, (t == DType::F32 ? 1e-6 : 1e-4) + 4 * run_to_run) << optim << " " << dtype_name(t);
      EXPECT_GT(moved, 1e-5) << optim << " " << dtype_name(t);
      EXPECT_NEAR(loss_host, loss_gpu, (t == DType::F32 ? 1e-5 : 1e-3) * std::abs(loss_gpu)) << optim;
    }
}

TEST(OffloadGpu, DeviceHoldsNoMasterWeightsOrOptimizerState) {
  std::string why;
  if (!mixed_precision_available(&why)) GTEST_SKIP() << "no mixed precision: " << why;
  auto be = make_cuda_backend({});
  TrainingArguments a;
  a.per_device_train_batch_size = 4;
  a.bf16 = true;
  a.offload_optimizer = true;
  const ModelConfig c = test::small_bert();
  TrainingRun run(a, c, 64, *be, gradient_memory_for(a));
  for (Category k : {Category::MasterWeights, Category::OptimizerState})
    EXPECT_EQ(run.memory().arena_bytes(k), 0u) << category_name(k);
  EXPECT_GT(run.memory().arena_bytes(Category::HostOptimizerState), 0u);
  EXPECT_EQ(run.memory().plan().host_bytes(), run.memory().arena_bytes(Category::HostMasterWeights) +
                                                  run.memory().arena_bytes(Category::HostGradients) +
                                                  run.memory().arena_bytes(Category::HostOptimizerState) +
                                                  run.memory().arena_bytes(Category::HostWorkspace));
}

// The transfers an offloaded step makes, over host buffers small (cudaHostAlloc) and large
// (allocated, touched and registered): down after the compute stream's work, up, and the
// compute stream waiting for what went up.
TEST(OffloadGpu, TransfersRoundTripThroughSmallAndLargeHostBuffers) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  auto be = make_cuda_backend({});
  for (size_t bytes : {size_t(4) << 10, size_t(80) << 20}) {
    const int64_t n = int64_t(bytes / sizeof(float));
    float* a = static_cast<float*>(be->allocate_host(bytes));
    float* b = static_cast<float*>(be->allocate_host(bytes));
    for (int64_t i = 0; i < n; ++i) a[i] = float(i % 1000003) * 0.5f;
    Tensor ha{a, DType::F32, {n}, Device::CPU}, hb{b, DType::F32, {n}, Device::CPU};
    Tensor d{be->allocate(bytes), DType::F32, {n}, Device::CUDA}, e{be->allocate(bytes), DType::F32, {n}, Device::CUDA};
    be->compute_waits_for(be->transfer_to_device(ha, d));
    ops::copy(*be, d, e);  // on the compute stream, after the upload
    be->wait_transfer(be->transfer_to_host(e, hb));
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += b[i] != a[i];
    EXPECT_EQ(wrong, 0) << bytes << " bytes";
    be->deallocate(d.data);
    be->deallocate(e.data);
    be->deallocate_host(a);
    be->deallocate_host(b);
  }
}

}  // namespace
}  // namespace hone
