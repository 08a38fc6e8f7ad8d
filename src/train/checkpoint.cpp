#include "hone/checkpoint.h"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <filesystem>
#include <regex>
#include <fstream>

#include "hone/error.h"
#include "hone/safetensors.h"
#include "hone/schedule.h"
#include "hone/tokenizer.h"
#include "hone/weights.h"

namespace hone {
namespace fs = std::filesystem;

namespace {

constexpr const char* kPrefix = "checkpoint-";

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  if (!f) fail("cannot read {}: no such file", p.string());
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: invalid JSON: {}", p.string(), e.what());
  }
}

// The step of a "checkpoint-N" directory name, or -1.
int64_t checkpoint_step(const std::string& name) {
  if (!name.starts_with(kPrefix)) return -1;
  int64_t step = -1;
  const char* b = name.data() + std::char_traits<char>::length(kPrefix);
  const char* e = name.data() + name.size();
  auto r = std::from_chars(b, e, step);
  return r.ec == std::errc{} && r.ptr == e && b != e ? step : -1;
}

// Trainer writes optimizer.pt (a pickled torch state); hone writes the optimizer's state
// tensors as safetensors, in the model's flat parameter order, with the optimizer that
// wrote them in the metadata.
// Where rank r (> 0) of a ZeRO run leaves its share for rank 0: a temporary sibling of the
// checkpoint named with the writer's pid, so that remove_stale_temporaries clears one that
// a crash left behind.
std::string share_prefix(const std::string& dir, int rank) {
  return fmt::format(".{}-optimizer-rank{}.tmp.", fs::path(dir).filename().string(), rank);
}

std::string share_path(const std::string& dir, int rank) {
  return (fs::path(dir).parent_path() / (share_prefix(dir, rank) + std::to_string(::getpid()))).string();
}

// Rank r's share as rank 0 finds it: the newest file of that name (one from a crashed run's
// save of the same step is older).
std::string find_share(const std::string& dir, int rank) {
  const fs::path parent = fs::path(dir).parent_path();
  const std::string prefix = share_prefix(dir, rank);
  std::error_code ec;
  fs::path best;
  fs::file_time_type newest{};
  for (const fs::directory_entry& e : fs::directory_iterator(parent.empty() ? "." : parent, ec)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with(prefix)) continue;
    const fs::file_time_type t = e.last_write_time(ec);
    if (best.empty() || t > newest) best = e.path(), newest = t;
  }
  if (best.empty()) fail("rank {} left no share of the optimizer state for {} ({}*)", rank, dir, prefix);
  return best.string();
}

// This rank's optimizer state on the host, in its state tensors' order.
std::vector<std::vector<std::byte>> host_state(TrainingRun& run, const std::vector<StateTensor>& state) {
  std::vector<std::vector<std::byte>> bytes(state.size());
  for (size_t i = 0; i < state.size(); ++i) {
    bytes[i].resize(state[i].tensor.bytes());
    run.copy_to_host(state[i].tensor, bytes[i].data());
  }
  return bytes;
}

void save_optimizer_state(const std::string& path, const std::string& dir, TrainingRun& run, int64_t step) {
  const Optimizer& opt = run.optimizer();
  const std::vector<StateTensor> state = opt.state();
  std::vector<std::vector<std::byte>> bytes = host_state(run, state);
  std::vector<Shape> shapes;
  for (const StateTensor& s : state) shapes.push_back(s.tensor.shape);
  if (run.sharding().sharded()) {
    // The other ranks' shares (save_optimizer_share) after this one's, in rank order: the
    // state of one process.
    for (int r = 1; r < run.sharding().world_size; ++r) {
      const std::string part = find_share(dir, r);
      {
        SafetensorsFile file(part);
        for (size_t i = 0; i < state.size(); ++i) {
          const SafetensorsEntry* e = file.find(state[i].name);
          if (!e || e->dtype != state[i].tensor.dtype) fail("{}: no {} share of {}", part, dtype_name(state[i].tensor.dtype), state[i].name);
          const std::byte* p = static_cast<const std::byte*>(e->data);
          bytes[i].insert(bytes[i].end(), p, p + e->numel() * int64_t(dtype_size(e->dtype)));
        }
      }
      fs::remove(part);
    }
    for (size_t i = 0; i < state.size(); ++i) shapes[i] = Shape{int64_t(bytes[i].size() / dtype_size(state[i].tensor.dtype))};
  }
  std::vector<NamedTensor> named;
  for (size_t i = 0; i < state.size(); ++i)
    named.push_back({state[i].name, host_tensor(bytes[i].data(), state[i].tensor.dtype, shapes[i])});
  write_safetensors(path, named,
                    {{"format", "hone"},
                     {"optim", std::string(opt.name())},
                     {"optimizer_state", std::string(opt.state_kind())},
                     {"step", std::to_string(step)}});
}

void load_optimizer_state(const std::string& path, TrainingRun& run) {
  const Optimizer& opt = run.optimizer();
  SafetensorsFile file(path);
  // Checkpoints from before optimizers were components hold AdamW's moments and no kind.
  const auto kind = file.metadata().find("optimizer_state");
  const std::string saved = kind == file.metadata().end() ? "adamw" : kind->second;
  if (saved != opt.state_kind()) {
    const auto optim = file.metadata().find("optim");
    fail("{}: the checkpoint holds the state of {} ({}); this run's --optim {} keeps {}", path,
         optim == file.metadata().end() ? "adamw_torch" : "--optim " + optim->second, saved, opt.name(),
         opt.state_kind());
  }
  // Under ZeRO this rank's share starts at its offset in the whole, which the file holds.
  const bool sharded = run.sharding().sharded();
  const std::vector<StateTensor> state = opt.state();
  const std::vector<int64_t> at = sharded ? run.state_offsets(run.sharding().rank) : std::vector<int64_t>(state.size(), 0);
  const std::vector<int64_t> whole = sharded ? run.state_offsets(run.sharding().world_size) : std::vector<int64_t>{};
  for (size_t i = 0; i < state.size(); ++i) {
    const StateTensor& s = state[i];
    const SafetensorsEntry* e = file.find(s.name);
    if (!e) fail("{}: no tensor {} for --optim {}", path, s.name, opt.name());
    const int64_t expected = sharded ? whole[i] : s.tensor.numel();
    if (e->dtype != s.tensor.dtype || e->numel() != expected)
      fail("{}: {} is {} of {} elements; this run's --optim {} keeps {} of {}", path, s.name, dtype_name(e->dtype),
           e->numel(), opt.name(), dtype_name(s.tensor.dtype), expected);
    // A NaN moment would pass through every later update into the weights.
    if (const int64_t bad = first_non_finite(*e); bad >= 0)
      fail("{}: optimizer state '{}' is not finite at {} (a damaged file, or saved from a run that diverged)", path,
           s.name, element_index(e->shape, bad));
    run.copy_from_host(static_cast<const std::byte*>(e->data) + at[i] * int64_t(dtype_size(e->dtype)), s.tensor);
  }
}

}  // namespace

std::string StaleTemporary::describe() const {
  if (!restored_as.empty())
    return fmt::format("restored {} as {}: a save was interrupted before its new checkpoint took that name", path,
                       restored_as);
  return fmt::format("removed {} ({:.1f} MB), left by an interrupted save", path, double(bytes) / 1e6);
}

std::vector<StaleTemporary> remove_stale_temporaries(const std::string& dir) {
  std::vector<StaleTemporary> removed;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return removed;
  static const std::regex pattern(R"(^\..+\.(tmp|old)\.([0-9]{1,9})$)");
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    std::smatch m;
    if (!std::regex_match(name, m, pattern)) continue;
    const pid_t pid = pid_t(std::stol(m[2].str()));
    if (pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to judge
    // A save killed between its two renames leaves the step's previous checkpoint as
    // `.NAME.old.PID` and no NAME: that is the step's only complete copy, so it goes back.
    const fs::path final_path =
        e.path().parent_path() / name.substr(1, name.size() - 1 - size_t(m[1].length() + m[2].length()) - 2);
    if (m[1] == "old" && !fs::exists(final_path, ec)) {
      fs::rename(e.path(), final_path, ec);
      if (ec) fail("cannot restore {} as {}: {}", e.path().string(), final_path.string(), ec.message());
      removed.push_back({e.path().string(), 0, final_path.string()});
      continue;
    }
    uint64_t bytes = 0;
    if (e.is_directory(ec)) {
      for (const auto& f : fs::recursive_directory_iterator(e.path(), ec))
        if (f.is_regular_file(ec)) bytes += f.file_size(ec);
    } else {
      bytes = e.file_size(ec);
    }
    fs::remove_all(e.path(), ec);
    if (ec) fail("cannot remove {}, left by an interrupted save: {}", e.path().string(), ec.message());
    removed.push_back({e.path().string(), bytes, ""});
  }
  return removed;
}

std::string checkpoint_path(const std::string& output_dir, int64_t step) {
  return (fs::path(output_dir) / fmt::format("{}{}", kPrefix, step)).string();
}

nlohmann::ordered_json TrainerState::to_json(const TrainingArguments& a, const StepCounts& sc) const {
  nlohmann::ordered_json j;
  j["best_global_step"] = nullptr;
  j["best_metric"] = best_metric ? nlohmann::ordered_json(*best_metric) : nlohmann::ordered_json(nullptr);
  j["best_model_checkpoint"] =
      best_model_checkpoint.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(best_model_checkpoint);
  if (best_metric && !best_model_checkpoint.empty())
    j["best_global_step"] = checkpoint_step(fs::path(best_model_checkpoint).filename().string());
  j["epoch"] = epoch;
  j["eval_steps"] = a.eval_steps > 0 ? a.eval_steps : a.logging_steps;
  j["global_step"] = global_step;
  j["is_hyper_param_search"] = false;
  j["is_local_process_zero"] = true;
  j["is_world_process_zero"] = true;
  j["log_history"] = log_history;
  j["logging_steps"] = a.logging_steps;
  j["max_steps"] = sc.total_updates;
  j["num_input_tokens_seen"] = tokens;
  j["num_train_epochs"] = sc.epochs;
  j["save_steps"] = a.save_steps;
  j["total_flos"] = total_flos;
  j["train_batch_size"] = a.per_device_train_batch_size;
  j["trial_name"] = nullptr;
  j["trial_params"] = nullptr;
  // Doubles are written with 17 significant digits, so they read back bit for bit.
  j["hone_resume"] = {{"micro_steps", micro_steps},
                      {"last_logged_step", last_logged_step},
                      {"loss_since_log", loss_since_log},
                      {"total_loss", total_loss}};
  return j;
}

TrainerState TrainerState::from_json(const nlohmann::json& j, const std::string& source) {
  TrainerState s;
  try {
    s.global_step = j.at("global_step").get<int64_t>();
    s.epoch = j.at("epoch").get<double>();
    s.log_history = j.at("log_history");
    if (!j.at("best_metric").is_null()) s.best_metric = j.at("best_metric").get<double>();
    if (!j.at("best_model_checkpoint").is_null()) s.best_model_checkpoint = j.at("best_model_checkpoint");
    s.total_flos = j.at("total_flos").get<double>();
    s.tokens = j.value("num_input_tokens_seen", int64_t(0));
    const auto& r = j.at("hone_resume");
    s.micro_steps = r.at("micro_steps").get<int64_t>();
    s.last_logged_step = r.at("last_logged_step").get<int64_t>();
    s.loss_since_log = r.at("loss_since_log").get<double>();
    s.total_loss = r.at("total_loss").get<double>();
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not a trainer state that hone wrote: {}", source, e.what());
  }
  if (s.global_step < 0 || s.micro_steps < 0) fail("{}: negative step counts", source);
  return s;
}

void save_checkpoint(const std::string& dir, TrainingRun& run, const ModelFiles& files, const TrainerState& state,
                     const TrainingArguments& a, const StepCounts& sc) {
  const fs::path final_dir(dir), parent = final_dir.parent_path();
  const fs::path tmp = parent / fmt::format(".{}.tmp.{}", final_dir.filename().string(), ::getpid());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) fail("cannot create {}: {}", tmp.string(), ec.message());

  const ParamLayout& layout = run.model().layout();
  std::vector<float> host(size_t(layout.count()));
  run.read_weights(host.data());
  save_pretrained(tmp.string(), files.config, layout, host.data());
  if (files.tokenizer) files.tokenizer->save(tmp.string());
  save_optimizer_state((tmp / "optimizer.safetensors").string(), dir, run, state.global_step);
  nlohmann::ordered_json sched;
  sched["lr_scheduler_type"] = a.lr_scheduler_type;
  const int64_t applied = state.global_step - run.skipped_steps();  // fp16 skips hold the schedule
  sched["last_epoch"] = applied;
  sched["total_steps"] = sc.total_updates;
  sched["last_lr"] = learning_rate_at(a, applied, sc.total_updates);
  write_file_atomic((tmp / "scheduler.json").string(), sched.dump(2) + "\n");
  // Every random draw of hone is a counter-based Philox stream: the seed and the counters
  // (the micro-step for dropout, the epoch for the data order) are the whole RNG state.
  nlohmann::ordered_json rng;
  rng["seed"] = a.seed;
  rng["micro_steps"] = state.micro_steps;
  rng["epoch"] = state.epoch;
  write_file_atomic((tmp / "rng_state.json").string(), rng.dump(2) + "\n");
  if (run.loss_scaling()) {  // GradScaler's state (Trainer keeps it in scaler.pt)
    const auto [scale, clean, skipped] = run.scaler_state();
    nlohmann::ordered_json sj;
    sj["scale"] = scale;
    sj["growth_tracker"] = int64_t(clean);
    sj["skipped_steps"] = int64_t(skipped);
    write_file_atomic((tmp / "scaler.json").string(), sj.dump(2) + "\n");
  }
  write_file_atomic((tmp / "trainer_state.json").string(), state.to_json(a, sc).dump(2) + "\n");
  write_file_atomic((tmp / "training_args.json").string(), to_json(a).dump(2) + "\n");  // Trainer: training_args.bin
  sync_directory(tmp.string());

  // Replace an existing checkpoint of the same step only once the new one is complete.
  const fs::path old = parent / fmt::format(".{}.old.{}", final_dir.filename().string(), ::getpid());
  const bool existed = fs::exists(final_dir);
  if (existed) {
    fs::rename(final_dir, old, ec);
    if (ec) fail("cannot replace {}: {}", dir, ec.message());
  }
  fs::rename(tmp, final_dir, ec);
  if (ec) fail("cannot rename {} to {}: {}", tmp.string(), dir, ec.message());
  sync_directory(parent.empty() ? "." : parent.string());
  if (existed) fs::remove_all(old, ec);
}

void save_optimizer_share(const std::string& dir, TrainingRun& run) {
  HONE_CHECK(run.sharding().sharded() && run.sharding().rank > 0, "an optimizer share from rank {} of {}",
             run.sharding().rank, run.sharding().world_size);
  const std::vector<StateTensor> state = run.optimizer().state();
  std::vector<std::vector<std::byte>> bytes = host_state(run, state);
  std::vector<NamedTensor> named;
  for (size_t i = 0; i < state.size(); ++i)
    named.push_back({state[i].name, host_tensor(bytes[i].data(), state[i].tensor.dtype, state[i].tensor.shape)});
  std::error_code ec;
  fs::create_directories(fs::path(dir).parent_path(), ec);  // before rank 0 has made it
  write_safetensors(share_path(dir, run.sharding().rank), named, {{"format", "hone"}});
}

TrainerState load_checkpoint(const std::string& dir, TrainingRun& run) {
  const fs::path d(dir);
  if (!fs::is_directory(d)) fail("--resume_from_checkpoint {}: no such directory", dir);
  const ModelConfig saved = ModelConfig::load((d / "config.json").string());
  const ModelConfig& mine = run.model().config();
  if (ParamLayout(saved).count() != run.model().layout().count() || saved.num_labels != mine.num_labels ||
      saved.hidden_size != mine.hidden_size || saved.num_hidden_layers != mine.num_hidden_layers)
    fail("{}: the checkpoint is of a different model ({} layers, hidden {}, {} labels) than this run's ({} layers, "
         "hidden {}, {} labels)",
         dir, saved.num_hidden_layers, saved.hidden_size, saved.num_labels, mine.num_hidden_layers, mine.hidden_size,
         mine.num_labels);
  const ParamLayout& layout = run.model().layout();
  std::vector<float> host(size_t(layout.count()));
  LoadReport r = load_weights((d / "model.safetensors").string(), mine, layout, host.data(), 0);
  if (!r.initialized.empty())
    fail("{}/model.safetensors lacks {} of the model's parameters (first: {})", dir, r.initialized.size(),
         r.initialized.front());
  run.write_weights(host.data());

  load_optimizer_state((d / "optimizer.safetensors").string(), run);
  if (run.loss_scaling()) {
    const fs::path scaler_path = d / "scaler.json";
    if (fs::exists(scaler_path)) {
      const nlohmann::json sj = read_json(scaler_path);
      try {
        run.set_scaler_state({sj.at("scale").get<double>(), sj.at("growth_tracker").get<double>(),
                              sj.at("skipped_steps").get<double>()});
      } catch (const nlohmann::json::exception& e) {
        fail("{}: {}", scaler_path.string(), e.what());
      }
    }  // else a checkpoint of an fp32 or bf16 run: the scaler starts afresh, as in Trainer
  }

  const fs::path state_path = d / "trainer_state.json";
  return TrainerState::from_json(read_json(state_path), state_path.string());
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& output_dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(output_dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(output_dir, ec)) {
    const int64_t step = checkpoint_step(e.path().filename().string());
    // Temporary directories start with '.', so only completed checkpoints count.
    if (step >= 0 && e.is_directory() && fs::exists(e.path() / "trainer_state.json"))
      out.emplace_back(step, e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string resolve_checkpoint(const std::string& spec, const std::string& output_dir) {
  if (spec != "last") return spec;
  auto all = list_checkpoints(output_dir);
  if (all.empty()) fail("--resume_from_checkpoint last: no checkpoint-N directory in {}", output_dir);
  return all.back().second;
}

std::vector<std::string> rotate_checkpoints(const std::string& output_dir, int64_t limit, const std::string& keep) {
  std::vector<std::string> removed;
  if (limit <= 0) return removed;
  auto all = list_checkpoints(output_dir);
  const auto is_kept = [&](const std::string& p) {
    std::error_code ec;
    return !keep.empty() && fs::equivalent(p, keep, ec);
  };
  if (all.empty()) return removed;
  // As in Trainer, the best checkpoint survives, and so does the newest (to resume from):
  // with a limit of 1 and an older best one, two remain.
  const bool old_best = std::any_of(all.begin(), all.end() - 1, [&](const auto& c) { return is_kept(c.second); });
  const int64_t allowed = old_best ? std::max<int64_t>(limit, 2) : limit;
  int64_t count = int64_t(all.size());
  for (const auto& [step, path] : all) {
    if (count <= allowed) break;
    if (is_kept(path) || path == all.back().second) continue;
    std::error_code ec;
    fs::remove_all(path, ec);
    if (ec) fail("cannot remove old checkpoint {}: {}", path, ec.message());
    removed.push_back(path);
    --count;
  }
  return removed;
}

}  // namespace hone
