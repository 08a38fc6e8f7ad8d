// transformers' Adafactor as Trainer builds it: lr from --learning_rate (and the schedule),
// scale_parameter and relative_step off, eps (1e-30, 1e-3), clip_threshold 1, decay_rate
// -0.8, no first moment, weight decay from Trainer's parameter groups. Trainer passes it no
// --optim_args; hone takes beta1 (a first moment, as transformers' beta1), clip_threshold
// and decay_rate there. Matrices keep a factored second moment (a value per row and per
// column), vectors a full one: all of it in one flat buffer, tensor after tensor in the
// parameters' order (exp_avg_sq_factors in checkpoints).
#include <cmath>
#include <cstring>

#include "hone/error.h"
#include "hone/ops.h"
#include "optim/optimizers.h"

namespace hone::optim {
namespace {

struct AdafactorSettings {
  double weight_decay, beta1, clip_threshold, decay_rate;
  bool first_moment;
};

class Adafactor final : public Optimizer {
 public:
  Adafactor(std::string_view name, AdafactorSettings s) : name_(name), s_(s) {}

  std::string_view name() const override { return name_; }
  std::string_view state_kind() const override { return s_.first_moment ? "adafactor_beta1" : "adafactor"; }

  void take_state(BufferSource& mem, const ParamLayout& layout) override {
    tensors_.clear();
    int64_t factors = 0, widest = 0;
    for (const ParamEntry& e : layout.entries()) {
      AdafactorTensor t;
      t.factored = e.shape.rank >= 2;
      t.rows = t.factored ? e.shape.numel() / e.shape[e.shape.rank - 1] : 1;
      t.cols = e.shape[e.shape.rank - 1];
      t.decay = e.decay;
      factors += t.factored ? t.rows + t.cols : t.cols;
      tensors_.push_back(t);
      entries_.push_back(&e);
      widest = std::max(widest, t.rows * t.cols);
    }
    factors_ = mem.take(Category::OptimizerState, "adafactor_exp_avg_sq_factors", -1, DType::F32, {factors});
    if (s_.first_moment) m_ = mem.take(Category::OptimizerState, "adafactor_exp_avg", -1, DType::F32, {layout.count()});
    int64_t at = 0;
    for (AdafactorTensor& t : tensors_) {
      if (t.factored) {
        t.row = factors_.rows(at, at + t.rows);
        t.col = factors_.rows(at + t.rows, at + t.rows + t.cols);
        at += t.rows + t.cols;
      } else {
        t.v = factors_.rows(at, at + t.cols);
        at += t.cols;
      }
    }
  }

  void reset_state(Backend& be) override {
    ops::fill(be, factors_, 0.0f);
    if (m_.data) ops::fill(be, m_, 0.0f);
  }

  void scalars(double lr, int64_t step, float* out) const override {
    AdafactorScalars k{};
    k.lr = float(lr);
    k.beta2t = float(1.0 - std::pow(double(step), s_.decay_rate));
    k.eps1 = 1e-30f;
    k.clip_threshold = float(s_.clip_threshold);
    k.beta1 = float(s_.beta1);
    k.weight_decay = float(s_.weight_decay);
    std::memcpy(out, &k, sizeof k);
  }

  void update(Backend& be, BufferSource& mem, const OptimizerTarget& t) override {
    int64_t scratch = 1;
    for (const AdafactorTensor& a : tensors_) scratch = std::max(scratch, be.adafactor_workspace_elems(a.rows, a.cols));
    Tensor ws = mem.take(Category::Workspace, "adafactor_workspace", -1, DType::F32, {scratch});
    const Tensor scalars = t.scalars.rows(0, kAdafactorScalarsSize);
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const ParamEntry& e = *entries_[i];
      if (!t.updates(e.group)) continue;
      AdafactorTensor a = tensors_[i];
      a.param = t.param(e);
      a.grad = t.grad(e);
      a.half = t.half_of(e);
      if (m_.data) a.m = m_.rows(e.offset, e.offset + e.shape.numel());
      Tensor w = ws.rows(0, be.adafactor_workspace_elems(a.rows, a.cols));
      ops::adafactor(be, a, scalars, t.norm_coef, w);
    }
    mem.release(ws);
  }

  std::vector<StateTensor> state() const override {
    std::vector<StateTensor> out{{"exp_avg_sq_factors", factors_}};
    if (m_.data) out.push_back({"exp_avg", m_});
    return out;
  }

 private:
  std::string_view name_;
  AdafactorSettings s_;
  Tensor factors_, m_;
  std::vector<AdafactorTensor> tensors_;  // the state's slices, per parameter
  std::vector<const ParamEntry*> entries_;
};

static_assert(kAdafactorScalarsSize <= kOptimizerScalarsSize);

}  // namespace

std::unique_ptr<Optimizer> make_adafactor(std::string_view name, const TrainingArguments& a, ArgsReader& args) {
  const double beta1 = args.number("beta1", -1), clip = args.number("clip_threshold", 1.0),
               decay_rate = args.number("decay_rate", -0.8);
  const bool first_moment = beta1 >= 0;
  if (first_moment && beta1 >= 1) fail("--optim_args beta1={}: must be in [0, 1)", beta1);
  if (clip <= 0) fail("--optim_args clip_threshold={}: must be > 0", clip);
  if (decay_rate >= 0) fail("--optim_args decay_rate={}: must be < 0", decay_rate);
  return std::make_unique<Adafactor>(name, AdafactorSettings{a.weight_decay, first_moment ? beta1 : 0.0, clip,
                                                             decay_rate, first_moment});
}

}  // namespace hone::optim
