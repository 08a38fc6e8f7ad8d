#pragma once
// Shared by the op families: the checks behind the ops.h wrappers, which name the op and
// the tensor in their messages, and the walk over a dropout mask.
#include <array>
#include <initializer_list>
#include <string_view>
#include <type_traits>

#include "hone/backend.h"
#include "hone/philox.h"
#include "hone/profile.h"

// A hot CPU loop compiled three times, for AVX-512 (x86-64-v4), AVX2 with FMA (v3) and the
// baseline, and the one this CPU runs picked when the library loads (GCC's target_clones):
// the release build targets the baseline, whose 4-wide SSE leaves the divisions and
// square roots of an optimizer's loop compute-bound on a few cores. The file must build
// with -ffp-contract=off, so that the v3 and v4 copies fuse no multiply-add the baseline
// does not, and every copy computes the same bits.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HONE_VECTOR_CLONES [[gnu::target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")]]
#else
#define HONE_VECTOR_CLONES
#endif

namespace hone::ops::detail {

// Reports the op being dispatched to the backend's profiler, when one is attached; it
// times the op from construction to destruction.
class OpScope {
 public:
  OpScope(Backend& be, const char* name, OpClass c, OpCost cost = {}) : p_(be.profiler) {
    if (p_) p_->begin_op(name, c, cost);
  }
  // A cost that takes a walk over a list to count: counted only while profiling.
  template <typename F>
    requires std::is_invocable_r_v<OpCost, F>
  OpScope(Backend& be, const char* name, OpClass c, F&& cost) : p_(be.profiler) {
    if (p_) p_->begin_op(name, c, cost());
  }
  ~OpScope() {
    if (p_) p_->end_op();
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  OpProfiler* p_;
};

// The bytes of tensors read or written once each (none of an empty tensor's).
inline double bytes_if(const Tensor* t) { return t && t->data ? double(t->bytes()) : 0.0; }
template <typename... T>
inline double bytes(const T&... t) {
  return (0.0 + ... + bytes_if(&t));
}

inline void expect_dtype(const char* op, const char* name, const Tensor& t, DType want) {
  if (t.dtype != want) fail("{}: {} has dtype {}, expected {}", op, name, dtype_name(t.dtype), dtype_name(want));
}

// A tensor of the run's compute dtype: F32, or BF16 / F16 under mixed precision, which the
// CPU reference does not compute in.
inline void expect_compute(Backend& be, const char* op, const char* name, const Tensor& t) {
  if (t.dtype != DType::F32 && t.dtype != DType::BF16 && t.dtype != DType::F16)
    fail("{}: {} has dtype {}, expected F32, BF16 or F16", op, name, dtype_name(t.dtype));
  if (t.dtype != DType::F32 && be.device() == Device::CPU && !be.dry_run)  // plans may be made anywhere
    fail("{}: {} is {}, but the CPU backend computes in F32 only (mixed precision needs a GPU)", op, name,
         dtype_name(t.dtype));
}

inline void expect_shape(const char* op, const char* name, const Tensor& t, const Shape& want) {
  if (!(t.shape == want)) fail("{}: {} has shape {}, expected {}", op, name, t.shape.str(), want.str());
}

inline void expect(const char* op, const char* name, const Tensor& t, DType dtype, const Shape& shape) {
  expect_dtype(op, name, t, dtype);
  expect_shape(op, name, t, shape);
}

inline void expect_rank(const char* op, const char* name, const Tensor& t, int rank) {
  if (t.shape.rank != rank) fail("{}: {} has shape {}, expected rank {}", op, name, t.shape.str(), rank);
}

// Whether a and b share a byte. Only real memory says: the planner's tensors carry
// stand-in addresses, so callers skip this in a dry run. A tensor without data (an absent
// optional output) overlaps nothing.
inline bool overlap(const Tensor& a, const Tensor& b) {
  const char *a0 = static_cast<const char*>(a.data), *b0 = static_cast<const char*>(b.data);
  return a0 && b0 && a.bytes() > 0 && b.bytes() > 0 && a0 < b0 + b.bytes() && b0 < a0 + a.bytes();
}

struct NamedTensor {
  const char* name;
  const Tensor& t;
};

// Fails when an output shares memory with another output or with an input, except that
// the output named in_place[0] may be the input named in_place[1] itself (same address;
// the caller has checked that their shapes and dtypes agree): ops that allow it read each
// element before writing it.
inline void expect_disjoint(const char* op, std::initializer_list<NamedTensor> outputs,
                            std::initializer_list<NamedTensor> inputs, std::array<std::string_view, 2> in_place) {
  for (auto out = outputs.begin(); out != outputs.end(); ++out) {
    for (auto other = outputs.begin(); other != out; ++other)
      if (overlap(out->t, other->t)) fail("{}: outputs {} and {} share memory", op, other->name, out->name);
    for (const NamedTensor& in : inputs) {
      if (!overlap(out->t, in.t)) continue;
      const bool allowed = out->name == in_place[0] && in.name == in_place[1];
      if (allowed && out->t.data == in.t.data) continue;
      if (allowed)
        fail("{}: {} overlaps {} without being it (it may only be {} itself)", op, out->name, in.name, in.name);
      fail("{}: {} shares memory with the input {}", op, out->name, in.name);
    }
  }
}

inline void expect_dropout(const char* op, const DropoutSpec& d) {
  if (!(d.p >= 0.0f && d.p <= 1.0f)) fail("{}: dropout probability {} is outside [0, 1]", op, d.p);
}

}  // namespace hone::ops::detail
