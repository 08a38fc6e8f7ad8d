// torch.optim.AdamW as Trainer builds it: betas and eps from --adam_beta1/2 and
// --adam_epsilon, weight decay on every parameter but biases and LayerNorm parameters.
// The moments are flat F32 buffers in the parameters' layout; each decay range of each
// group is one slice of a single multi-tensor launch.
#include <cstring>

#include "hone/deepspeed.h"
#include "hone/ops.h"
#include "optim/optimizers.h"

namespace hone::optim {
namespace {

class AdamW final : public Optimizer {
 public:
  AdamW(std::string_view name, const TrainingArguments& a)
      : name_(name),
        beta1_(a.adam_beta1),
        beta2_(a.adam_beta2),
        eps_(a.adam_epsilon),
        weight_decay_(a.weight_decay),
        decay_all_(a.deepspeed_config && !a.deepspeed_config->optimizer_type.empty()) {}

  std::string_view name() const override { return name_; }
  std::string_view state_kind() const override { return "adamw"; }

  void take_state(BufferSource& mem, const ParamLayout& layout) override {
    const int64_t n = layout.count();
    m_ = mem.take(Category::OptimizerState, "adam_exp_avg", -1, DType::F32, {n});
    v_ = mem.take(Category::OptimizerState, "adam_exp_avg_sq", -1, DType::F32, {n});
    ranges_ = decay_ranges(layout);
    if (decay_all_)
      for (ParamRange& r : ranges_) r.decay = true;
    slices_.reserve(ranges_.size());
  }

  void reset_state(Backend& be) override {
    ops::fill(be, m_, 0.0f);
    ops::fill(be, v_, 0.0f);
  }

  void scalars(double lr, int64_t step, float* out) const override {
    const AdamWScalars k = adamw_scalars(step_of(lr, step));
    std::memcpy(out, &k, sizeof k);
  }

  void update(Backend& be, BufferSource&, const OptimizerTarget& t) override {
    const Tensor scalars = t.scalars.rows(0, kAdamWScalarsSize);
    AdamWStep s = step_of(0.0, 1);
    s.scalars = &scalars;  // the update's own values, staged by the run
    slices_.clear();
    for (const ParamRange& r : ranges_) {
      if (!t.updates(r.group)) continue;
      const int64_t at = t.layout.groups()[size_t(r.group)].begin;
      const Tensor& g = t.group_grads[size_t(r.group)];
      slices_.push_back({t.params.rows(r.begin, r.end), g.rows(r.begin - at, r.end - at), m_.rows(r.begin, r.end),
                         v_.rows(r.begin, r.end), r.decay ? weight_decay_ : 0.0,
                         t.half_rows(r.begin, r.end)});
    }
    ops::adamw(be, slices_.data(), int(slices_.size()), s, t.norm_coef);
  }

  std::vector<StateTensor> state() const override { return {{"exp_avg", m_}, {"exp_avg_sq", v_}}; }

 private:
  AdamWStep step_of(double lr, int64_t step) const { return {lr, beta1_, beta2_, eps_, weight_decay_, step}; }

  std::string_view name_;
  double beta1_, beta2_, eps_, weight_decay_;
  // A DeepSpeed optimizer block: DeepSpeed's AdamW over all parameters in one group, biases
  // and LayerNorm parameters decayed too.
  bool decay_all_;
  Tensor m_, v_;
  std::vector<ParamRange> ranges_;
  std::vector<AdamWSlice> slices_;  // refilled each update within its reserved capacity
};

static_assert(kAdamWScalarsSize <= kOptimizerScalarsSize);

}  // namespace

std::unique_ptr<Optimizer> make_adamw(std::string_view name, const TrainingArguments& a, ArgsReader&) {
  return std::make_unique<AdamW>(name, a);
}

}  // namespace hone::optim
