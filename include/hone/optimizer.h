#pragma once
// Optimizers as components. A training run knows its optimizer only through this
// interface: the optimizer takes its state from the memory plan, computes on the host the
// values that change from update to update (the run stages them into device memory, so a
// recorded CUDA graph reads the current ones), queues its update, and names its state for
// checkpoints. Gradient clipping stays with the run, as in Trainer: every optimizer
// updates with grad * norm_coef[1] (the clip coefficient, times the inverse fp16 loss
// scale) and changes nothing when norm_coef[2] != 0 (an fp16 step whose gradients
// overflowed). Adding an optimizer is a new file under src/optim and one line in the
// registry (src/optim/registry.cpp).
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "hone/args.h"
#include "hone/backend.h"
#include "hone/model.h"
#include "hone/memory.h"

namespace hone {

// --optim_args as Trainer reads it: "key=value,key=value", spaces ignored.
using OptimArgs = std::map<std::string, std::string>;
OptimArgs parse_optim_args(const std::string& text);

// Floats of per-update values an optimizer may stage (AdamW uses kAdamWScalarsSize).
constexpr int kOptimizerScalarsSize = 16;

// What one update reads and writes.
struct OptimizerTarget {
  const ParamLayout& layout;
  Tensor params;  // F32 [layout.count()]: the parameters (the master weights under mixed precision)
  // Mixed precision: the compute-dtype copy of params [half_begin, count), rewritten from
  // them; else empty. The embedding tables before half_begin have none (model.h).
  Tensor half;
  const std::vector<Tensor>& group_grads;  // F32 gradients of each layout group
  Tensor norm_coef;  // F32 [kNormCoefSize], from clip_coefficient
  Tensor scalars;    // F32 [kOptimizerScalarsSize]: what Optimizer::scalars wrote for this update
  // >= 0: this call updates only that layout group's parameters (an offloaded update runs
  // group by group, as each group's gradients land); -1: every group.
  int group = -1;
  int64_t half_begin = 0;
  bool updates(int g) const { return group < 0 || group == g; }

  // One parameter's slices of the flat buffers (half: empty without mixed precision).
  Tensor param(const ParamEntry& e) const;
  Tensor grad(const ParamEntry& e) const;
  Tensor half_of(const ParamEntry& e) const;
  Tensor half_rows(int64_t begin, int64_t end) const;  // params [begin, end)'s copy; empty: none
};

// A contiguous range of the flat buffers with one weight-decay setting: each group's
// decayed parameters, then the rest (biases and LayerNorm parameters take no decay, as
// Trainer groups them).
struct ParamRange {
  int group;
  int64_t begin, end;  // in the flat buffers
  bool decay;
};
std::vector<ParamRange> decay_ranges(const ParamLayout& layout);

// A named piece of optimizer state, as a checkpoint holds it.
struct StateTensor {
  std::string name;
  Tensor tensor;  // in the backend's memory
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // The --optim name, and the kind of state it keeps: checkpoints resume only into an
  // optimizer of the same kind (adamw_torch and adamw_torch_fused share theirs).
  virtual std::string_view name() const = 0;
  virtual std::string_view state_kind() const = 0;
  // Setup phase: takes the state (Category::OptimizerState) from the plan.
  virtual void take_state(BufferSource& mem, const ParamLayout& layout) = 0;
  // Sets the state to what it is before the first update.
  virtual void reset_state(Backend& be) = 0;
  // Host side: the per-update values of update `step` (1-based, applied updates only) at
  // learning rate lr, into out[kOptimizerScalarsSize].
  virtual void scalars(double lr, int64_t step, float* out) const = 0;
  // Queues the update on the backend. Workspace it needs is taken from mem and released
  // before it returns, so the plan holds it.
  virtual void update(Backend& be, BufferSource& mem, const OptimizerTarget& t) = 0;
  virtual std::vector<StateTensor> state() const = 0;
};

// The optimizer --optim names, configured from the arguments and --optim_args.
std::unique_ptr<Optimizer> make_optimizer(const TrainingArguments& a);
// Checks --optim and --optim_args (names, keys and values) without building anything.
void validate_optimizer(const TrainingArguments& a);
// The --optim values hone implements.
std::vector<std::string_view> optimizer_names();

}  // namespace hone
