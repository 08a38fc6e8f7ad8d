// The element-wise optimizers as Trainer builds them: torch.optim.SGD and torch.optim.Adagrad
// (lr and the --optim_args Trainer reads; weight decay from Trainer's two parameter groups,
// as L2 on the gradient) and bitsandbytes' 32-bit Lion (Trainer passes it --adam_beta1/2;
// decoupled weight decay). The state is one flat F32 buffer in the parameters' layout.
#include <cmath>
#include <cstring>

#include "hone/error.h"
#include "hone/ops.h"
#include "optim/optimizers.h"

namespace hone::optim {
namespace {

struct ElementwiseSettings {
  ElementwiseOptimizer kind;
  std::string_view state_kind;  // also the checkpoint's name for it: "" for none
  const char* state_name;
  double weight_decay, beta1 = 0, beta2 = 0, eps = 0, lr_decay = 0;
  bool nesterov = false;
};

class Elementwise final : public Optimizer {
 public:
  Elementwise(std::string_view name, ElementwiseSettings s) : name_(name), s_(s) {}

  std::string_view name() const override { return name_; }
  std::string_view state_kind() const override { return s_.state_kind; }

  void take_state(BufferSource& mem, const ParamLayout& layout) override {
    if (s_.state_name) state_ = mem.take(Category::OptimizerState, s_.state_name, -1, DType::F32, {layout.count()});
    ranges_ = decay_ranges(layout);
    slices_.reserve(ranges_.size());
  }

  void reset_state(Backend& be) override {
    if (state_.data) ops::fill(be, state_, 0.0f);
  }

  void scalars(double lr, int64_t step, float* out) const override {
    ElementwiseScalars k{};
    k.lr = float(lr);
    k.weight_decay = float(s_.weight_decay);
    k.beta1 = float(s_.beta1);
    k.beta2 = float(s_.beta2);
    k.eps = float(s_.eps);
    if (s_.kind == ElementwiseOptimizer::Sgd) {
      k.beta2 = float(1.0 - s_.beta2);  // beta2 holds the dampening
      k.first = step == 1 ? 1.0f : 0.0f;
      k.nesterov = s_.nesterov ? 1.0f : 0.0f;
    } else if (s_.kind == ElementwiseOptimizer::Adagrad) {
      k.lr = float(lr / (1.0 + double(step - 1) * s_.lr_decay));
    }
    std::memcpy(out, &k, sizeof k);
  }

  void update(Backend& be, BufferSource&, const OptimizerTarget& t) override {
    slices_.clear();
    for (const ParamRange& r : ranges_) {
      if (!t.updates(r.group)) continue;
      const int64_t at = t.layout.groups()[size_t(r.group)].begin;
      slices_.push_back({t.params.rows(r.begin, r.end), t.group_grads[size_t(r.group)].rows(r.begin - at, r.end - at),
                         state_.data ? state_.rows(r.begin, r.end) : Tensor{}, r.decay,
                         t.half_rows(r.begin, r.end)});
    }
    ops::elementwise_optimizer(be, s_.kind, slices_.data(), int(slices_.size()),
                               t.scalars.rows(0, kElementwiseScalarsSize), t.norm_coef);
  }

  std::vector<StateTensor> state() const override {
    if (!state_.data) return {};
    return {{s_.state_name, state_}};
  }

 private:
  std::string_view name_;
  ElementwiseSettings s_;
  Tensor state_;
  std::vector<ParamRange> ranges_;
  std::vector<ElementwiseSlice> slices_;  // refilled each update within its reserved capacity
};

static_assert(kElementwiseScalarsSize <= kOptimizerScalarsSize);

// Trainer's groups set each parameter's weight decay, so a weight_decay in --optim_args
// would do nothing in torch: refused rather than ignored.
void refuse_weight_decay(ArgsReader& args, std::string_view name) {
  if (args.number("weight_decay", 0) != 0)
    fail("--optim_args weight_decay: Trainer's parameter groups set the weight decay of --optim {}; use "
         "--weight_decay",
         name);
}

}  // namespace

std::unique_ptr<Optimizer> make_sgd(std::string_view name, const TrainingArguments& a, ArgsReader& args) {
  const double momentum = args.number("momentum", 0), dampening = args.number("dampening", 0);
  const bool nesterov = args.flag("nesterov", false);
  refuse_weight_decay(args, name);
  if (momentum < 0) fail("--optim_args momentum={}: must be >= 0", momentum);
  if (nesterov && (momentum <= 0 || dampening != 0))
    fail("--optim_args nesterov=true needs momentum > 0 and dampening 0 (as torch.optim.SGD), got momentum {} and "
         "dampening {}",
         momentum, dampening);
  const bool buffer = momentum != 0;
  return std::make_unique<Elementwise>(
      name, ElementwiseSettings{ElementwiseOptimizer::Sgd, buffer ? "sgd_momentum" : "sgd",
                                buffer ? "momentum_buffer" : nullptr, a.weight_decay, momentum, dampening, 0, 0,
                                nesterov});
}

std::unique_ptr<Optimizer> make_adagrad(std::string_view name, const TrainingArguments& a, ArgsReader& args) {
  const double lr_decay = args.number("lr_decay", 0), eps = args.number("eps", 1e-10);
  refuse_weight_decay(args, name);
  if (lr_decay < 0 || eps < 0) fail("--optim_args: adagrad needs lr_decay >= 0 and eps >= 0");
  return std::make_unique<Elementwise>(
      name, ElementwiseSettings{ElementwiseOptimizer::Adagrad, "adagrad", "sum", a.weight_decay, 0, 0, eps, lr_decay});
}

std::unique_ptr<Optimizer> make_lion(std::string_view name, const TrainingArguments& a, ArgsReader&) {
  return std::make_unique<Elementwise>(name, ElementwiseSettings{ElementwiseOptimizer::Lion, "lion", "exp_avg",
                                                                 a.weight_decay, a.adam_beta1, a.adam_beta2});
}

}  // namespace hone::optim
