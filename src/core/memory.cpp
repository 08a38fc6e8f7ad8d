#include "hone/memory.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <fmt/format.h>

#include "hone/backend.h"

namespace hone {
namespace {

size_t align_up(size_t n) { return (n + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment; }

std::atomic<int64_t>& allocation_counter() {
  static std::atomic<int64_t> n{0};
  return n;
}

std::string_view phase_name(Phase p) {
  switch (p) {
    case Phase::Setup: return "setup";
    case Phase::MicroStep: return "micro-step";
    case Phase::OptimizerStep: return "optimizer step";
    case Phase::Inference: return "inference";
    case Phase::PackedInference: return "packed inference";
    case Phase::HiddenStates: return "hidden states";
  }
  return "?";
}

}  // namespace

std::string_view category_name(Category c) {
  switch (c) {
    case Category::Weights: return "weights";
    case Category::MasterWeights: return "master weights";
    case Category::Gradients: return "gradients";
    case Category::OptimizerState: return "optimizer state";
    case Category::Activations: return "activations";
    case Category::Workspace: return "workspace";
    case Category::HostMasterWeights: return "host master weights";
    case Category::HostGradients: return "host gradients";
    case Category::HostOptimizerState: return "host optimizer state";
    case Category::HostWorkspace: return "host workspace";
  }
  return "?";
}

std::string PlannedBuffer::label() const {
  return index >= 0 ? fmt::format("{}[{}]", name, index) : name;
}

size_t MemoryPlan::total_bytes() const {
  size_t t = 0;
  for (int c = 0; c < kNumCategories; ++c)
    if (!on_host(Category(c))) t += category_bytes[size_t(c)];
  return t;
}

size_t MemoryPlan::host_bytes() const {
  size_t t = 0;
  for (int c = 0; c < kNumCategories; ++c)
    if (on_host(Category(c))) t += category_bytes[size_t(c)];
  return t;
}

std::array<size_t, kNumCategories> MemoryPlan::unshared_bytes() const {
  std::array<size_t, kNumCategories> out{};
  for (const auto& b : buffers) out[size_t(b.category)] += b.bytes;
  return out;
}

void MemoryPlan::pack() {
  category_bytes.fill(0);
  for (int c = 0; c < kNumCategories; ++c) {
    if (arena_of[c] != Category(c)) continue;  // packed with its host
    std::vector<PlannedBuffer*> order;
    for (auto& b : buffers)
      if (arena_of[size_t(b.category)] == Category(c)) order.push_back(&b);
    // Largest first, then earliest: a stable, deterministic layout.
    std::stable_sort(order.begin(), order.end(), [](auto* a, auto* b) {
      return a->bytes != b->bytes ? a->bytes > b->bytes : a->first < b->first;
    });
    std::vector<PlannedBuffer*> placed;
    for (PlannedBuffer* b : order) {
      // Gaps between buffers alive at the same time; take the smallest gap that fits.
      std::vector<std::pair<size_t, size_t>> busy;
      for (PlannedBuffer* p : placed)
        if (p->first <= b->last && b->first <= p->last) busy.emplace_back(p->offset, p->offset + p->bytes);
      std::sort(busy.begin(), busy.end());
      size_t best = SIZE_MAX, best_gap = SIZE_MAX, cursor = 0;
      for (auto [lo, hi] : busy) {
        if (lo > cursor && lo - cursor >= b->bytes && lo - cursor < best_gap) {
          best = cursor;
          best_gap = lo - cursor;
        }
        cursor = std::max(cursor, hi);
      }
      b->offset = best != SIZE_MAX ? best : cursor;
      placed.push_back(b);
      category_bytes[c] = std::max(category_bytes[c], b->offset + b->bytes);
    }
  }
}

// ---------------------------------------------------------------- planner

Tensor MemoryPlanner::take(Category c, const char* name, int index, DType t, Shape s) {
  HONE_CHECK(in_phase_, "take({}) outside a phase", name);
  Tensor out{reinterpret_cast<void*>(next_token_ * kBufferAlignment), t, s, Device::CPU};
  ++next_token_;
  size_t bytes = align_up(std::max<size_t>(out.bytes(), 1));
  plan_.buffers.push_back({name, index, c, phase_, bytes, clock_++, INT64_MAX});
  live_.push_back(plan_.buffers.size() - 1);
  return out;
}

void MemoryPlanner::release(const Tensor& t) {
  uintptr_t token = reinterpret_cast<uintptr_t>(t.data) / kBufferAlignment;
  for (size_t i = 0; i < live_.size(); ++i) {
    PlannedBuffer& b = plan_.buffers[live_[i]];
    // Tokens are handed out in take order, so buffer k has token k + 1.
    if (uintptr_t(live_[i]) + 1 == token) {
      HONE_CHECK(b.phase != Phase::Setup, "setup buffer {} released", b.label());
      b.last = clock_++;
      live_.erase(live_.begin() + i);
      return;
    }
  }
  HONE_CHECK(false, "release of a tensor that is not live");
}

void MemoryPlanner::begin_phase(Phase p) {
  HONE_CHECK(!in_phase_, "phase {} begun inside another", phase_name(p));
  phase_ = p;
  in_phase_ = true;
}

void MemoryPlanner::end_phase() {
  HONE_CHECK(in_phase_, "end_phase outside a phase");
  if (phase_ != Phase::Setup)
    for (size_t i : live_)
      HONE_CHECK(plan_.buffers[i].phase == Phase::Setup, "{} buffer {} not released by the end of its phase",
                 phase_name(phase_), plan_.buffers[i].label());
  in_phase_ = false;
}

MemoryPlan MemoryPlanner::finish() {
  HONE_CHECK(!in_phase_, "finish inside a phase");
  plan_.pack();
  return std::move(plan_);
}

Tensor HostCategories::take(Category c, const char* name, int index, DType t, Shape s) {
  switch (c) {
    case Category::MasterWeights: c = Category::HostMasterWeights; break;
    case Category::Gradients: c = Category::HostGradients; break;
    case Category::OptimizerState: c = Category::HostOptimizerState; break;
    case Category::Workspace: c = Category::HostWorkspace; break;
    case Category::Weights:
    case Category::Activations: HONE_CHECK(false, "{} asked for {} on the host", name, category_name(c));
    default: break;
  }
  return inner_.take(c, name, index, t, s);
}

// ---------------------------------------------------------------- arenas

Arena::Arena(Category c, Backend& be, size_t bytes) : category_(c), backend_(be), bytes_(bytes) {
  if (bytes == 0) return;
  try {
    base_ = static_cast<char*>(on_host(c) ? be.allocate_host(bytes) : be.allocate(bytes));
  } catch (const Error& e) {
    fail("the {} arena of {:.1f} MiB: {}", category_name(c), double(bytes) / (1 << 20), e.what());
  }
  ++allocation_counter();
}

Arena::~Arena() {
  if (!base_) return;
  if (on_host(category_))
    backend_.deallocate_host(base_);
  else
    backend_.deallocate(base_);
}

int64_t Arena::allocation_count() { return allocation_counter().load(); }

// ---------------------------------------------------------------- replay

PlannedMemory::PlannedMemory(MemoryPlan plan, Backend& be) : plan_(std::move(plan)), device_(be.device()) {
  for (int c = 0; c < kNumCategories; ++c)
    arenas_.push_back(std::make_unique<Arena>(Category(c), be, plan_.category_bytes[c]));
  for (size_t i = 0; i < plan_.buffers.size(); ++i) phase_buffers_[size_t(plan_.buffers[i].phase)].push_back(i);
  live_.reserve(plan_.buffers.size());
}

size_t PlannedMemory::arena_bytes(Category c) const { return arenas_[size_t(c)]->bytes(); }

void PlannedMemory::begin_phase(Phase p) {
  HONE_CHECK(!in_phase_, "phase {} begun inside another", phase_name(p));
  phase_ = p;
  in_phase_ = true;
  cursor_ = 0;
}

void PlannedMemory::end_phase() {
  HONE_CHECK(in_phase_, "end_phase outside a phase");
  const auto& list = phase_buffers_[size_t(phase_)];
  HONE_CHECK(cursor_ == list.size(), "{} phase took {} buffers, the plan has {}", phase_name(phase_), cursor_,
             list.size());
  in_phase_ = false;
}

Tensor PlannedMemory::take(Category c, const char* name, int index, DType t, Shape s) {
  HONE_CHECK(in_phase_, "take({}) outside a phase", name);
  const auto& list = phase_buffers_[size_t(phase_)];
  HONE_CHECK(cursor_ < list.size(), "{} phase takes more buffers than planned ({} {})", phase_name(phase_),
             name, index);
  size_t id = list[cursor_++];
  const PlannedBuffer& b = plan_.buffers[id];
  const size_t arena = size_t(plan_.arena_of[size_t(c)]);
  Tensor out{arenas_[arena]->base() + b.offset, t, s, on_host(c) ? Device::CPU : device_};
  HONE_CHECK(b.category == c && b.name == name && b.index == index && out.bytes() <= b.bytes,
             "request {}[{}] of {} bytes does not match the plan's {} ({} bytes)", name, index, out.bytes(),
             b.label(), b.bytes);
  if (check_overlaps_) {
    char* lo = static_cast<char*>(out.data);
    for (size_t j : live_) {
      const PlannedBuffer& o = plan_.buffers[j];
      const size_t o_arena = size_t(plan_.arena_of[size_t(o.category)]);
      char* olo = arenas_[o_arena]->base() + o.offset;
      HONE_CHECK(o_arena != arena || lo + b.bytes <= olo || olo + o.bytes <= lo, "{} overlaps live buffer {}",
                 b.label(), o.label());
    }
  }
  if (b.phase != Phase::Setup) live_.push_back(id);
  return out;
}

void PlannedMemory::release(const Tensor& t) {
  for (size_t i = 0; i < live_.size(); ++i) {
    const PlannedBuffer& b = plan_.buffers[live_[i]];
    if (arenas_[size_t(plan_.arena_of[size_t(b.category)])]->base() + b.offset == t.data) {
      live_.erase(live_.begin() + i);
      return;
    }
  }
  HONE_CHECK(false, "release of a tensor that is not live");
}

}  // namespace hone
