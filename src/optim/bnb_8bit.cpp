// bitsandbytes' 8-bit optimizers as Trainer builds them: --optim adamw_bnb_8bit and
// adamw_8bit (bnb.optim.AdamW, optim_bits=8, betas and eps from --adam_beta1/2 and
// --adam_epsilon) and lion_8bit (bnb.optim.Lion, optim_bits=8, betas from
// --adam_beta1/2), weight decay on every parameter but biases and LayerNorm parameters.
// The update is written down in ops/optim_8bit_math.h.
//
// State, in the parameters' order: the quantized tensors share one U8 buffer of codes per
// state and one F32 buffer of absmax (one per 256 elements of each tensor, so 1 byte and
// 1/64 byte per parameter and state); the others (embeddings, biases, LayerNorm) share
// one F32 buffer per state. The dynamic maps are constants
// of the state, rebuilt by reset_state and not saved.
#include <array>
#include <cstring>

#include "hone/ops.h"
#include "ops/optim_8bit_math.h"
#include "optim/optimizers.h"

namespace hone::optim {
namespace {

// bitsandbytes keeps 32-bit state for tensors under min_8bit_size, and Trainer has it do
// so for every nn.Embedding weight.
constexpr int64_t kMin8bitSize = 4096;

bool quantized(const ParamEntry& e) {
  return e.shape.numel() >= kMin8bitSize && !e.name.ends_with("_embeddings.weight");
}

class Bnb8bit final : public Optimizer {
 public:
  Bnb8bit(std::string_view name, const TrainingArguments& a, Optim8bitAlgo algo)
      : name_(name), algo_(algo), beta1_(a.adam_beta1), beta2_(a.adam_beta2), eps_(a.adam_epsilon),
        weight_decay_(a.weight_decay) {}

  std::string_view name() const override { return name_; }
  std::string_view state_kind() const override { return adamw() ? "adamw_8bit" : "lion_8bit"; }

  void take_state(BufferSource& mem, const ParamLayout& layout) override {
    int64_t codes = 0, blocks = 0, floats = 0;
    places_.clear();
    for (const ParamEntry& e : layout.entries()) {
      const int64_t n = e.shape.numel();
      if (quantized(e)) {
        places_.push_back({true, codes, blocks});
        codes += n;
        blocks += bnb::blocks_of(n);
      } else {
        places_.push_back({false, floats, 0});
        floats += n;
      }
    }
    codes_ = codes;
    for (int s = 0; s < states(); ++s) {
      // Whole floats of codes, so that reset_state can zero them as F32.
      code_buffers_[s] = mem.take(Category::OptimizerState, "bnb_codes", s, DType::U8, {(codes + 3) / 4 * 4});
      absmax_[s] = mem.take(Category::OptimizerState, "bnb_absmax", s, DType::F32, {blocks});
      small_[s] = mem.take(Category::OptimizerState, "bnb_32bit_state", s, DType::F32, {floats});
    }
    qmaps_ = mem.take(Category::OptimizerState, "bnb_qmaps", -1, DType::F32, {states() * bnb::kMapSize});
    slices_.reserve(places_.size());
  }

  void reset_state(Backend& be) override {
    for (int s = 0; s < states(); ++s) {
      const Tensor& c = code_buffers_[s];
      Tensor as_floats{c.data, DType::F32, {c.numel() / 4}, c.device};
      ops::fill(be, as_floats, 0.0f);  // all bits zero: code 0
      ops::fill(be, absmax_[s], 0.0f);
      ops::fill(be, small_[s], 0.0f);
    }
    bnb::dynamic_map(true, host_maps_.data());
    bnb::dynamic_map(false, host_maps_.data() + bnb::kMapSize);
    // host_maps_ outlives the copy, which may still be reading it when this returns.
    ops::copy(be, host_tensor(host_maps_.data(), DType::F32, qmaps_.shape), qmaps_);
  }

  void scalars(double lr, int64_t step, float* out) const override {
    const Optim8bitScalars k = optim_8bit_scalars(lr, beta1_, beta2_, eps_, weight_decay_, step);
    std::memcpy(out, &k, sizeof k);
  }

  void update(Backend& be, BufferSource&, const OptimizerTarget& t) override {
    slices_.clear();
    for (size_t i = 0; i < places_.size(); ++i) {
      const ParamEntry& e = t.layout.entries()[i];
      if (!t.updates(e.group)) continue;
      const Place& p = places_[i];
      const int64_t n = e.shape.numel();
      Optim8bitSlice x{t.param(e), t.grad(e), t.half_of(e), e.decay, {}, {}, {}, {}};
      Tensor* state[2] = {&x.state1, &x.state2};
      Tensor* absmax[2] = {&x.absmax1, &x.absmax2};
      for (int s = 0; s < states(); ++s) {
        if (p.quantized) {
          *state[s] = code_buffers_[s].rows(p.at, p.at + n);
          *absmax[s] = absmax_[s].rows(p.block, p.block + bnb::blocks_of(n));
        } else {
          *state[s] = small_[s].rows(p.at, p.at + n);
        }
      }
      slices_.push_back(x);
    }
    ops::optim_8bit(be, algo_, slices_.data(), int(slices_.size()), t.scalars.rows(0, kOptim8bitScalarsSize),
                    qmaps_, t.norm_coef);
  }

  // bitsandbytes' names for each parameter's state, over all parameters.
  std::vector<StateTensor> state() const override {
    std::vector<StateTensor> out;
    for (int s = 0; s < states(); ++s) {
      const std::string k = std::to_string(s + 1);
      out.push_back({"state" + k, code_buffers_[s].rows(0, codes_)});
      out.push_back({"absmax" + k, absmax_[s]});
      out.push_back({"state" + k + "_32bit", small_[s]});
    }
    return out;
  }

 private:
  // Where each parameter's state lives (in the layout's order): its first code and block,
  // or its first float.
  struct Place {
    bool quantized;
    int64_t at, block;
  };

  bool adamw() const { return algo_ == Optim8bitAlgo::AdamW; }
  int states() const { return adamw() ? 2 : 1; }

  std::string_view name_;
  Optim8bitAlgo algo_;
  double beta1_, beta2_, eps_, weight_decay_;
  std::vector<Place> places_;
  int64_t codes_ = 0;
  Tensor code_buffers_[2], absmax_[2], small_[2], qmaps_;
  std::array<float, 2 * bnb::kMapSize> host_maps_{};
  std::vector<Optim8bitSlice> slices_;  // refilled each update within its reserved capacity
};

static_assert(kOptim8bitScalarsSize <= kOptimizerScalarsSize);

}  // namespace

std::unique_ptr<Optimizer> make_adamw_8bit(std::string_view name, const TrainingArguments& a, ArgsReader&) {
  return std::make_unique<Bnb8bit>(name, a, Optim8bitAlgo::AdamW);
}

std::unique_ptr<Optimizer> make_lion_8bit(std::string_view name, const TrainingArguments& a, ArgsReader&) {
  return std::make_unique<Bnb8bit>(name, a, Optim8bitAlgo::Lion);
}

}  // namespace hone::optim
