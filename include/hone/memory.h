#pragma once
// The memory plan. Every buffer of a run is requested through a BufferSource with a
// category, a name and a shape. Planning runs the real training code once against a
// MemoryPlanner, which hands out null tensors and records when each buffer is taken
// and released. The recorded lifetimes are packed into one arena per category (buffers
// whose lifetimes do not overlap share bytes). The run then replays the same requests
// against PlannedMemory, which serves each one from its planned offset: the estimate
// and the run are the same plan, and the step loop never allocates.
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "hone/tensor.h"

namespace hone {

// Under mixed precision, Weights are the half-precision copy that forward and backward
// read, and MasterWeights the fp32 parameters the optimizer updates; in fp32 runs the
// weights are the parameters and MasterWeights is empty. The Host* categories live in
// page-locked host memory: an offloaded optimizer's master weights, the gradients it
// receives, its state and its workspace.
enum class Category : uint8_t {
  Weights,
  MasterWeights,
  Gradients,
  OptimizerState,
  Activations,
  Workspace,
  HostMasterWeights,
  HostGradients,
  HostOptimizerState,
  HostWorkspace
};
constexpr int kNumCategories = 10;
std::string_view category_name(Category c);
inline bool on_host(Category c) { return c >= Category::HostMasterWeights; }

// Phases replayed independently: setup runs once; the others repeat each step or batch.
// PackedInference: inference on sequences packed without their padding (TrainingRun::infer
// picks it for right-padded batches where the backend packs attention). HiddenStates:
// inference that also returns the last layer's every hidden state, so that layer runs
// whole (the others run it on the first tokens alone where the head reads no more).
enum class Phase : uint8_t { Setup, MicroStep, OptimizerStep, Inference, PackedInference, HiddenStates };
constexpr int kNumPhases = 6;

constexpr size_t kBufferAlignment = 256;

struct PlannedBuffer {
  std::string name;  // e.g. "qkv"
  int index;         // e.g. the layer number, or -1
  Category category;
  Phase phase;
  size_t bytes;      // aligned size
  int64_t first;     // event index of take
  int64_t last;      // event index of release; INT64_MAX if never released
  size_t offset = 0; // within the category arena
  std::string label() const;  // "qkv[3]"
};

class BufferSource {
 public:
  virtual ~BufferSource() = default;
  // `index` distinguishes repeated names (a layer number); -1 for none.
  virtual Tensor take(Category c, const char* name, int index, DType t, Shape s) = 0;
  virtual void release(const Tensor& t) = 0;
  virtual void begin_phase(Phase p) = 0;
  virtual void end_phase() = 0;
  virtual bool planning() const = 0;
};

class MemoryPlan {
 public:
  std::vector<PlannedBuffer> buffers;      // in take order
  // Bytes of each category's arena; 0 for a category whose buffers live in another's.
  std::array<size_t, kNumCategories> category_bytes{};
  // The arena each category's buffers are packed into (its own, unless shared).
  std::array<Category, kNumCategories> arena_of{
      Category::Weights,           Category::MasterWeights, Category::Gradients,          Category::OptimizerState,
      Category::Activations,       Category::Workspace,     Category::HostMasterWeights,  Category::HostGradients,
      Category::HostOptimizerState, Category::HostWorkspace};
  size_t total_bytes() const;  // of the device's arenas
  size_t host_bytes() const;   // of the page-locked host arenas
  // Sum of unshared sizes per category: what the plan would cost without reuse.
  std::array<size_t, kNumCategories> unshared_bytes() const;
  // Assigns offsets: greedy best-fit of lifetime intervals, largest buffers first.
  void pack();
};

class MemoryPlanner final : public BufferSource {
 public:
  Tensor take(Category c, const char* name, int index, DType t, Shape s) override;
  void release(const Tensor& t) override;
  void begin_phase(Phase p) override;
  void end_phase() override;
  bool planning() const override { return true; }
  MemoryPlan finish();  // packs; every non-setup buffer must have been released
  // Packs `guest`'s buffers into `host`'s arena, so that they can reuse its freed bytes.
  void share_arena(Category guest, Category host) { plan_.arena_of[size_t(guest)] = host; }

 private:
  MemoryPlan plan_;
  std::vector<size_t> live_;  // indices into plan_.buffers of taken, unreleased buffers
  int64_t clock_ = 0;
  Phase phase_ = Phase::Setup;
  bool in_phase_ = false;
  uintptr_t next_token_ = 1;  // fake addresses identify planned tensors on release
};

// Another source's buffers under their host categories: an offloaded optimizer asks for
// OptimizerState and Workspace as any optimizer does and gets HostOptimizerState and
// HostWorkspace (MasterWeights and Gradients map likewise).
class HostCategories final : public BufferSource {
 public:
  explicit HostCategories(BufferSource& inner) : inner_(inner) {}
  Tensor take(Category c, const char* name, int index, DType t, Shape s) override;
  void release(const Tensor& t) override { inner_.release(t); }
  void begin_phase(Phase p) override { inner_.begin_phase(p); }
  void end_phase() override { inner_.end_phase(); }
  bool planning() const override { return inner_.planning(); }

 private:
  BufferSource& inner_;
};

// One allocation per category, counted: device memory, or page-locked host memory
// (Backend::allocate_host) for the Host* categories.
class Backend;

class Arena {
 public:
  Arena(Category c, Backend& be, size_t bytes);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  char* base() const { return base_; }
  size_t bytes() const { return bytes_; }
  Category category() const { return category_; }
  // Process-wide count of underlying allocations, for the no-allocation-in-step test.
  static int64_t allocation_count();

 private:
  Category category_;
  Backend& backend_;
  char* base_ = nullptr;
  size_t bytes_ = 0;
};

class PlannedMemory final : public BufferSource {
 public:
  PlannedMemory(MemoryPlan plan, Backend& be);
  Tensor take(Category c, const char* name, int index, DType t, Shape s) override;
  void release(const Tensor& t) override;
  void begin_phase(Phase p) override;
  void end_phase() override;
  bool planning() const override { return false; }

  const MemoryPlan& plan() const { return plan_; }
  size_t arena_bytes(Category c) const;  // what was actually allocated
  // Test aid: check on every take that no two live buffers of a category overlap.
  void set_check_overlaps(bool on) { check_overlaps_ = on; }

 private:
  MemoryPlan plan_;
  std::vector<std::unique_ptr<Arena>> arenas_;
  std::array<std::vector<size_t>, kNumPhases> phase_buffers_;  // plan indices per phase
  Phase phase_ = Phase::Setup;
  bool in_phase_ = false;
  size_t cursor_ = 0;
  std::vector<size_t> live_;  // reserved once; no allocation during replay
  bool check_overlaps_ = false;
  Device device_;
};

}  // namespace hone
