// bert-large inference as shared/anchors/hf_infer_bench.py measures Hugging Face's: the same
// shapes (64 x 128, 64 x 512, 64 x 512 with lengths uniform in [16, 512] padded to 512,
// 1 x 128) and protocol (3 forward passes, then the median of 10, each ending with the
// logits on the host), random weights. hone runs an inference-only plan (weights in the
// compute dtype alone); the varlen batch runs packed, without its padding, in half precision. Prints one JSON line per configuration: samples/s, the plan's
// device bytes and the process's GPU memory (NVML). With --profile, five more passes of
// each shape run under the op profiler and its table follows the line: where the time goes.
// Usage: infer_bench [--profile] [--shape BxS[v] ...] [--lengths L1,L2,...] [--draws N] [bf16|fp16|tf32 ...]
// (default: bf16 and the four shapes below; v: lengths uniform in 16..S, or with --lengths
// those of its rows, as bench/anchor_lengths.py gives the rows of HF's varlen batch: HF pads
// them and computes every position whatever the lengths, where hone's work follows them).
// --draws N times a varlen shape on N batches of lengths drawn in turn (a line each, then one
// with the N batches' samples over the sum of their medians): one draw's token count moves
// about 5% either side of the distribution's mean, and hone's time with it.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "hone/cuda.h"
#include "hone/gpu_info.h"
#include "hone/profile.h"
#include "hone/trainer.h"
#include "hone/weights.h"

namespace hone {
namespace {

struct Shape2 {
  int batch, seq;
  bool varlen;
};

void bench(const std::string& precision, const ModelConfig& c, const std::vector<float>& weights, Shape2 s,
           const std::vector<int>& lengths, int draws, std::mt19937& g, bool profile) {
  TrainingArguments a;
  a.bf16 = precision == "bf16";
  a.fp16 = precision == "fp16";
  a.tf32 = precision == "tf32";
  a.per_device_eval_batch_size = s.batch;
  auto be = make_cuda_backend({0, a.tf32});
  TrainingRun run(a, c, s.seq, *be, GradientMemory::Persistent, RunPhases{false, s.batch});
  run.write_weights(weights.data());

  const size_t tokens = size_t(s.batch) * size_t(s.seq);
  // Page-locked inputs, as hone predict's loader hands them over (dataloader_pin_memory).
  std::unique_ptr<int32_t, std::function<void(int32_t*)>> host(
      static_cast<int32_t*>(be->allocate_host(3 * tokens * sizeof(int32_t))), [&](int32_t* p) { be->deallocate_host(p); });
  const std::span<int32_t> ids(host.get(), tokens), mask(host.get() + tokens, tokens), types(host.get() + 2 * tokens, tokens);
  std::fill(types.begin(), types.end(), 0);
  std::uniform_int_distribution<int32_t> id(100, 29999), len(16, s.seq);
  for (int32_t& x : ids) x = id(g);
  Batch batch;
  batch.rows = s.batch;
  batch.seq = s.seq;
  batch.ids = ids.data();
  batch.mask = mask.data();
  batch.types = types.data();
  std::vector<float> logits(size_t(s.batch) * size_t(c.num_labels));
  // Right-padded batches with padding run packed where the backend packs attention.
  const bool packed = s.varlen && be->packs_attention({s.batch, s.seq, c.num_attention_heads, c.head_dim(), 1.0f},
                                                      compute_dtype(a));
  const int batches = s.varlen && lengths.empty() ? std::max(1, draws) : 1;
  double seconds = 0;
  int64_t all_tokens = 0;
  for (int d = 0; d < batches; ++d) {
    std::fill(mask.begin(), mask.end(), 1);
    int64_t real = int64_t(tokens);
    if (s.varlen) {
      real = 0;
      for (int b = 0; b < s.batch; ++b) {
        const int n = lengths.empty() ? len(g) : lengths[size_t(b)];
        real += n;
        for (int t = n; t < s.seq; ++t) mask[size_t(b * s.seq + t)] = 0;
      }
    }
    for (int i = 0; i < 3; ++i) run.infer(batch, ForwardOutputs{logits.data()});
    std::vector<double> times;
    for (int i = 0; i < 10; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      run.infer(batch, ForwardOutputs{logits.data()});
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    seconds += median;
    all_tokens += real;
    const auto m = gpu_memory(0);
    fmt::print(R"({{"tool": "hone", "dtype": "{}", "bs": {}, "seq": {}, "varlen": {}, "packed": {}, {}"real_tokens": {}, )"
               R"("samples_per_s": {:.1f}, "ms_per_batch": {:.3f}, "plan_mb": {}, "process_mb": {}}})"
               "\n",
               precision, s.batch, s.seq, s.varlen, packed, batches > 1 ? fmt::format(R"("draw": {}, )", d) : "",
               real, s.batch / median, median * 1e3, run.memory().plan().total_bytes() >> 20,
               m && m->process_known ? int64_t(m->process_used >> 20) : -1);
  }
  if (batches > 1)
    fmt::print(R"({{"tool": "hone", "dtype": "{}", "bs": {}, "seq": {}, "varlen": true, "packed": {}, "draws": {}, )"
               R"("mean_real_tokens": {:.0f}, "samples_per_s": {:.1f}, "ms_per_batch": {:.3f}}})"
               "\n",
               precision, s.batch, s.seq, packed, batches, double(all_tokens) / batches,
               s.batch * batches / seconds, seconds / batches * 1e3);
  std::fflush(stdout);
  if (!profile) return;
  const Roofline roof = measure_roofline(*be, compute_dtype(a), precision);
  // Ops replayed from a CUDA graph pass no events: the profile runs a second, eager copy
  // (for small batches its times are then launches' rather than a replay's).
  TrainingArguments eager_args = a;
  eager_args.cuda_graphs = false;
  TrainingRun eager(eager_args, c, s.seq, *be, GradientMemory::Persistent, RunPhases{false, s.batch});
  eager.write_weights(weights.data());
  eager.infer(batch, ForwardOutputs{logits.data()});
  OpProfiler profiler(*be);
  profiler.start();
  for (int i = 0; i < 5; ++i) {
    if (i > 0) profiler.next_step();
    eager.infer(batch, ForwardOutputs{logits.data()});
  }
  const ProfileContext ctx{fmt::format("bert-large-uncased inference, {} x {}{}, {}", s.batch, s.seq,
                                       s.varlen ? " varlen" : "", precision),
                           be->name(), "GPU time between CUDA events around each op, eager"};
  fmt::print("{}\n", profile_table(summarize(profiler.finish(), roof), roof, ctx, 16));
  std::fflush(stdout);
}

}  // namespace
}  // namespace hone

int main(int argc, char** argv) {
  using namespace hone;
  try {
    std::string why;
    if (!cuda_available(&why)) {
      fmt::print(stderr, "infer_bench: no GPU: {}\n", why);
      return 1;
    }
    std::vector<std::string> precisions;
    std::vector<Shape2> shapes;
    std::vector<int> lengths;  // a varlen shape's rows, when given
    bool profile = false;
    int draws = 1;
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "--profile") {
        profile = true;
      } else if (arg == "--lengths" && i + 1 < argc) {
        const std::string list = argv[++i];
        for (size_t at = 0; at <= list.size();) {
          const size_t end = std::min(list.find(',', at), list.size());
          int n = 0;
          if (std::sscanf(list.substr(at, end - at).c_str(), "%d", &n) != 1 || n < 1) {
            fmt::print(stderr, "infer_bench: --lengths takes positive lengths separated by commas, not '{}'\n", list);
            return 2;
          }
          lengths.push_back(n);
          at = end + 1;
        }
      } else if (arg == "--draws" && i + 1 < argc) {
        if (std::sscanf(argv[++i], "%d", &draws) != 1 || draws < 1 || draws > 1000) {
          fmt::print(stderr, "infer_bench: --draws takes a count of 1 to 1000, not '{}'\n", argv[i]);
          return 2;
        }
      } else if (arg == "--shape" && i + 1 < argc) {
        Shape2 s{};
        char v = 0;
        const int n = std::sscanf(argv[++i], "%dx%d%c", &s.batch, &s.seq, &v);
        if (n < 2 || s.batch < 1 || s.seq < 16 || (n == 3 && v != 'v')) {
          fmt::print(stderr, "infer_bench: --shape takes BxS or BxSv (S >= 16), not '{}'\n", argv[i]);
          return 2;
        }
        s.varlen = n == 3;
        shapes.push_back(s);
      } else {
        precisions.push_back(arg);
      }
    }
    if (draws > 1 && !lengths.empty()) {
      fmt::print(stderr, "infer_bench: --draws draws the rows' lengths and --lengths gives them: not both\n");
      return 2;
    }
    if (precisions.empty()) precisions = {"bf16"};
    if (shapes.empty())
      shapes = {Shape2{64, 128, false}, Shape2{64, 512, false}, Shape2{64, 512, true}, Shape2{1, 128, false}};
    for (const Shape2 s : shapes)
      if (s.varlen && !lengths.empty() &&
          (lengths.size() != size_t(s.batch) || *std::max_element(lengths.begin(), lengths.end()) > s.seq)) {
        fmt::print(stderr,
                   "infer_bench: --lengths gives {} rows of at most {} tokens; the shape {}x{}v has {} of at most {}\n",
                   lengths.size(), *std::max_element(lengths.begin(), lengths.end()), s.batch, s.seq, s.batch, s.seq);
        return 2;
      }
    const ModelConfig c = *builtin_config("bert-large-uncased");
    const ParamLayout layout(c);
    std::vector<float> weights(size_t(layout.count()));
    init_weights(c, layout, weights.data(), 42);
    std::mt19937 g(0);
    for (const std::string& p : precisions) {
      if (p != "bf16" && p != "fp16" && p != "tf32") {
        fmt::print(stderr, "infer_bench: unknown precision '{}' (bf16, fp16 or tf32)\n", p);
        return 2;
      }
      for (const Shape2 s : shapes) bench(p, c, weights, s, s.varlen ? lengths : std::vector<int>{}, draws, g, profile);
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "infer_bench: {}\n", e.what());
    return 1;
  }
  return 0;
}
