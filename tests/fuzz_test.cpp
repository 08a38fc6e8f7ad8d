// Input fuzzing: a tiny valid model directory (config.json, model.safetensors, tokenizer
// files) and data set (CSV, TSV, JSONL), then many seeded cases that each damage one file
// in one way and run `hone train`, `predict` or `estimate` (or `train --config_name`) on
// it as a child process. Each case must end as a clean process: exit 0 where the damage
// leaves the input valid, or a non-zero exit with a `hone: error: ` line that names the
// file involved; never a signal, a hang, a huge allocation, an internal error or an
// uncaught exception.
//
// Deterministic: HONE_FUZZ_SEED (printed) picks the cases, HONE_FUZZ_CASES how many
// (default 2000) and HONE_FUZZ_SECONDS bounds the wall time (default 150: the cases not
// started by then are left out, and the count run is printed). HONE_FUZZ_ONLY=i runs case i
// alone, as a failure report prints it; HONE_FUZZ_KEEP=dir keeps the inputs of failing
// cases there; HONE_FUZZ_VERBOSE=1 prints every case's outcome; HONE_FUZZ_BINARY runs
// another hone executable than this build's. Each run is killed after HONE_FUZZ_TIMEOUT
// seconds (20) and limited to HONE_FUZZ_MEMORY_GB of address space (6; 0: no limit).
#include <gtest/gtest.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "hone/config.h"
#include "hone/weights.h"
#include "test_util.h"

extern char** environ;

namespace hone {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------- the child process

uint64_t env_u64(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  return std::strtoull(v, nullptr, 0);
}

struct Child {
  bool timed_out = false;
  int signal = 0;    // the signal that ended it, 0 if it exited
  int code = -1;     // its exit status, if it exited
  double seconds = 0;
  std::string out;   // stdout and stderr together
};

// hone with `args`, one thread, address space bounded (a run that allocates gigabytes
// from a damaged file fails fast instead of taking the machine's memory), killed after
// `timeout_s` seconds.
// The hone executable: this build's, or HONE_FUZZ_BINARY (to fuzz another build).
std::string hone_binary() {
  const char* other = std::getenv("HONE_FUZZ_BINARY");
  return other && *other ? other : HONE_BINARY;
}

Child run_hone(const std::vector<std::string>& args, double timeout_s) {
  std::vector<std::string> argv_s{hone_binary()};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  // The environment is built before fork: only async-signal-safe calls in the child.
  std::vector<std::string> env_s{"OMP_NUM_THREADS=1", "OPENBLAS_NUM_THREADS=1", "HONE_FUZZ_CHILD=1"};
  for (char** e = environ; *e; ++e)
    if (!std::string_view(*e).starts_with("OMP_NUM_THREADS=") && !std::string_view(*e).starts_with("OPENBLAS_"))
      env_s.push_back(*e);
  std::vector<char*> envp;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);

  const uint64_t memory_gb = env_u64("HONE_FUZZ_MEMORY_GB", 6);
  Child r;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    r.out = "pipe failed";
    return r;
  }
  const auto start = Clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::dup2(fds[1], 1);
    ::dup2(fds[1], 2);
    const rlimit as{rlim_t(memory_gb) << 30, rlim_t(memory_gb) << 30}, core{0, 0};
    if (memory_gb > 0) ::setrlimit(RLIMIT_AS, &as);
    ::setrlimit(RLIMIT_CORE, &core);
    ::execve(argv[0], argv.data(), envp.data());
    static const char kExecFailed[] = "fuzz: cannot execute the hone binary\n";
    (void)!::write(2, kExecFailed, sizeof kExecFailed - 1);
    ::_exit(127);
  }
  ::close(fds[1]);
  if (pid < 0) {
    ::close(fds[0]);
    r.out = "fork failed";
    return r;
  }
  const auto deadline = start + std::chrono::duration<double>(timeout_s);
  char buf[65536];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      r.timed_out = true;
      ::kill(-pid, SIGKILL);
      ::kill(pid, SIGKILL);
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int n = ::poll(&p, 1, int(std::min<long long>(left, 1000)));
    if (n < 0 && errno != EINTR) break;
    if (n <= 0) continue;
    const ssize_t got = ::read(fds[0], buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    if (r.out.size() < (1u << 20)) r.out.append(buf, size_t(got));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  if (WIFEXITED(status)) r.code = WEXITSTATUS(status);
  return r;
}

// ---------------------------------------------------------------- files

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

const std::vector<std::string> kSpecials = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
const std::vector<std::string> kWords = {"the", "film", "was", "plot",  "acting", "really", "quite",
                                         "good", "great", "bad", "awful", "fine",  ".",      ",",
                                         "##s",  "##ly"};

// The inputs every case starts from: two model directories, one with a vocab.txt
// tokenizer (and tokenizer_config.json, special_tokens_map.json) and one with a
// tokenizer.json, and a data set in each format.
struct Base {
  test::TempDir dir;
  std::string vocab_model, json_model, data;
  Base() {
    vocab_model = dir.path + "/vocab_model";
    json_model = dir.path + "/json_model";
    data = dir.path + "/data";
    ModelConfig c = *builtin_config("bert-tiny");
    c.vocab_size = int(kSpecials.size() + kWords.size());
    c.hidden_size = 32;
    c.num_attention_heads = 2;
    c.intermediate_size = 48;
    c.max_position_embeddings = 32;
    for (const std::string& m : {vocab_model, json_model}) test::save_random_model(m, c, 7);

    std::string vocab;
    for (const auto& t : kSpecials) vocab += t + "\n";
    for (const auto& t : kWords) vocab += t + "\n";
    write_text(vocab_model + "/vocab.txt", vocab);
    write_text(vocab_model + "/tokenizer_config.json",
               ordered_json{{"tokenizer_class", "BertTokenizer"}, {"do_lower_case", true},
                            {"tokenize_chinese_chars", true}, {"strip_accents", nullptr},
                            {"model_max_length", 512}, {"cls_token", "[CLS]"}, {"sep_token", "[SEP]"},
                            {"pad_token", "[PAD]"}, {"unk_token", "[UNK]"}, {"mask_token", "[MASK]"}}
                       .dump(2));
    write_text(vocab_model + "/special_tokens_map.json",
               ordered_json{{"cls_token", "[CLS]"}, {"mask_token", "[MASK]"}, {"pad_token", "[PAD]"},
                            {"sep_token", "[SEP]"}, {"unk_token", "[UNK]"}}
                   .dump(2));

    // tokenizer.json as `tokenizers` writes a BERT WordPiece tokenizer.
    ordered_json added = ordered_json::array(), vocab_j = ordered_json::object();
    for (size_t i = 0; i < kSpecials.size(); ++i)
      added.push_back({{"id", i}, {"content", kSpecials[i]}, {"single_word", false}, {"lstrip", false},
                       {"rstrip", false}, {"normalized", false}, {"special", true}});
    int id = 0;
    for (const auto& t : kSpecials) vocab_j[t] = id++;
    for (const auto& t : kWords) vocab_j[t] = id++;
    auto special = [](const char* name, int sid) {
      return ordered_json{{"id", name}, {"ids", {sid}}, {"tokens", {name}}};
    };
    auto piece = [](const char* kind, const char* name, int type) {
      return ordered_json{{kind, {{"id", name}, {"type_id", type}}}};
    };
    ordered_json tok = {
        {"version", "1.0"},
        {"truncation", nullptr},
        {"padding", nullptr},
        {"added_tokens", added},
        {"normalizer",
         {{"type", "BertNormalizer"}, {"clean_text", true}, {"handle_chinese_chars", true},
          {"strip_accents", nullptr}, {"lowercase", true}}},
        {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
        {"post_processor",
         {{"type", "TemplateProcessing"},
          {"single", {piece("SpecialToken", "[CLS]", 0), piece("Sequence", "A", 0), piece("SpecialToken", "[SEP]", 0)}},
          {"pair",
           {piece("SpecialToken", "[CLS]", 0), piece("Sequence", "A", 0), piece("SpecialToken", "[SEP]", 0),
            piece("Sequence", "B", 1), piece("SpecialToken", "[SEP]", 1)}},
          {"special_tokens", {{"[CLS]", special("[CLS]", 2)}, {"[SEP]", special("[SEP]", 3)}}}}},
        {"decoder", {{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", true}}},
        {"model",
         {{"type", "WordPiece"}, {"unk_token", "[UNK]"}, {"continuing_subword_prefix", "##"},
          {"max_input_chars_per_word", 100}, {"vocab", vocab_j}}}};
    write_text(json_model + "/tokenizer.json", tok.dump(2));
    write_text(json_model + "/tokenizer_config.json",
               ordered_json{{"tokenizer_class", "BertTokenizerFast"}, {"do_lower_case", true},
                            {"model_max_length", 512}}
                   .dump(2));

    fs::create_directories(data);
    std::string csv = "sentence,label\n", tsv = "sentence\tlabel\n", jsonl;
    const char* adj[] = {"good", "great", "bad", "awful"};
    for (int i = 0; i < 12; ++i) {
      const std::string text = fmt::format("the {} was {} {} .", i % 2 ? "film" : "plot", i % 3 ? "really" : "quite",
                                           adj[i % 4]);
      const std::string label = i % 4 < 2 ? "positive" : "negative";
      csv += (i % 3 == 0 ? "\"" + text + ", " + adj[i % 4] + "s\"" : text) + "," + label + "\n";
      tsv += text + "\t" + label + "\n";
      jsonl += ordered_json{{"sentence", text}, {"label", label}}.dump() + "\n";
    }
    write_text(data + "/train.csv", csv);
    write_text(data + "/train.tsv", tsv);
    write_text(data + "/train.jsonl", jsonl);
  }
};

const Base& base() {
  static Base b;
  return b;
}

// ---------------------------------------------------------------- cases

enum class Command { Train, Predict, Estimate, ConfigName };
const char* command_name(Command c) {
  switch (c) {
    case Command::Train: return "train";
    case Command::Predict: return "predict";
    case Command::Estimate: return "estimate";
    case Command::ConfigName: return "train --config_name";
  }
  return "?";
}

enum class Outcome {
  Either,      // the damage may leave the input valid
  MustFail,    // the input is invalid: exit 0 is a failure
  MustSucceed  // the input is valid (e.g. an unknown config field): an error is a failure
};

// One case's inputs, in its own directory: model/ (a copy of one of the base models),
// data files, cfg/config.json (for --config_name), out/.
struct Case {
  std::string dir, model, cfg_dir, train_file, out;
  Command command = Command::Train;
  std::string kind, what;             // the mutation, for the report
  std::string file;                   // the damaged file
  std::vector<std::string> names;     // the error must contain one of these (the file involved)
  bool names_required = true;         // else an error that names none is only counted
  std::string must_say;               // when set, the error must also say this
  Outcome outcome = Outcome::Either;
  // Run after exit 0: a non-empty return is a failure.
  std::function<std::string(const Case&)> after_success;
};

using Rng = std::mt19937_64;

uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

size_t below(Rng& g, size_t n) { return n ? size_t(g() % n) : 0; }
template <typename T>
const T& pick(Rng& g, const std::vector<T>& v) {
  return v[below(g, v.size())];
}
bool coin(Rng& g, double p = 0.5) { return std::uniform_real_distribution<double>(0, 1)(g) < p; }

// Values of every JSON type, some of them in range for the field they replace, as text
// (NaN, Infinity and a number that overflows a double are what Python's json may write).
const std::vector<std::string> kJsonValues = {
    "\"abc\"", "\"768\"", "\"\"", "3.5", "-1", "0", "-0", "1", "2", "65536", "100000000", "2147483647",
    "2147483648", "-2147483649", "9223372036854775807", "18446744073709551615", "1e308", "-1e308", "1e400",
    "NaN", "Infinity", "null", "true", "false", "[]", "[1, 2]", "{}", "{\"a\": 1}", "1.0", "0.5", "1e-30"};

// Keys and values of a JSON object as text, in order; rendering keeps duplicates and values
// that are not JSON.
using Fields = std::vector<std::pair<std::string, std::string>>;
Fields fields_of(const std::string& json_text) {
  Fields f;
  const ordered_json j = ordered_json::parse(json_text);
  for (const auto& [k, v] : j.items()) f.emplace_back(k, v.dump());
  return f;
}
std::string render(const Fields& f) {
  std::string s = "{\n";
  for (size_t i = 0; i < f.size(); ++i)
    s += fmt::format("  {}: {}{}\n", json(f[i].first).dump(), f[i].second, i + 1 < f.size() ? "," : "");
  return s + "}\n";
}

// Bytes overwritten at random places: NUL, bytes that are never UTF-8, lone lead and
// continuation bytes, structural characters of JSON/CSV, anything.
std::string flip_bytes(Rng& g, std::string s, size_t count, size_t from = 0, size_t to = std::string::npos) {
  static const std::vector<int> kBytes = {0, 0xFF, 0xFE, 0xC3, 0x80, 0xE2, '"', ',', '\t', '\n', '\r', '{', '}',
                                          '[', ']', ':', '\\', ' ', '0', '9', '-'};
  to = std::min(to, s.size());
  if (to <= from) return s;
  for (size_t i = 0; i < count; ++i) {
    const size_t at = from + below(g, to - from);
    s[at] = char(coin(g) ? pick(g, kBytes) : int(below(g, 256)));
  }
  return s;
}

// A cut strictly before the last '}' of a JSON object: never valid JSON.
std::string truncate_json(Rng& g, const std::string& s, std::string* what) {
  const size_t last = s.rfind('}');
  const size_t at = below(g, last == std::string::npos ? s.size() : last);
  *what = fmt::format("truncated to {} of {} bytes", at, s.size());
  return s.substr(0, at);
}

// -------- config.json

void config_case(Rng& g, Case& c, const std::string& kind) {
  const std::string file = c.command == Command::ConfigName ? c.cfg_dir + "/config.json" : c.model + "/config.json";
  c.file = file;
  c.names = {"config.json"};
  const std::string text = read_text(file);
  Fields f = fields_of(text);
  if (kind == "config.delete_field") {
    const size_t i = below(g, f.size());
    c.what = fmt::format("deleted '{}'", f[i].first);
    f.erase(f.begin() + long(i));
    write_text(file, render(f));
  } else if (kind == "config.wrong_value") {
    auto& [k, v] = f[below(g, f.size())];
    v = pick(g, kJsonValues);
    c.what = fmt::format("set '{}' to {}", k, v);
    write_text(file, render(f));
  } else if (kind == "config.truncate") {
    write_text(file, truncate_json(g, text, &c.what));
    c.outcome = Outcome::MustFail;
  } else if (kind == "config.flip_bytes") {
    const size_t n = 1 + below(g, 3);
    write_text(file, flip_bytes(g, text, n));
    c.what = fmt::format("{} random bytes overwritten", n);
  } else if (kind == "config.unknown_field") {
    // transformers keeps fields it does not know (and writes them back): so must hone.
    const std::vector<std::string> keys = {"my_custom_field", "gradient_checkpointing", "_name_or_path",
                                           "transformers_version", "use_cache", "", "\xd0\xba\xd0\xbb\xd1\x8e\xd1\x87",
                                           "hidden_size_", "Hidden_Size", "torch_dtype2"};
    const std::string key = pick(g, keys);
    std::string value = pick(g, kJsonValues);
    if (value == "NaN" || value == "Infinity" || value == "1e400") value = "\"x\"";  // not JSON
    f.insert(f.begin() + long(below(g, f.size() + 1)), {key, value});
    c.what = fmt::format("added unknown field {} = {}", json(key).dump(), value);
    write_text(file, render(f));
    c.outcome = Outcome::MustSucceed;
    if (c.command != Command::Estimate && c.command != Command::Predict)
      c.after_success = [key, value](const Case& k) -> std::string {
        const json saved = json::parse(read_text(k.out + "/config.json"));
        if (!saved.contains(key)) return "the saved config.json lost the unknown field " + json(key).dump();
        if (saved[key] != json::parse(value))
          return fmt::format("the saved config.json has {} = {}, not {}", json(key).dump(), saved[key].dump(), value);
        return "";
      };
  } else if (kind == "config.duplicate_key") {
    const size_t i = below(g, f.size());
    const std::string value = pick(g, kJsonValues);
    const bool after = coin(g);
    f.insert(f.begin() + long(after ? f.size() : 0), {f[i].first, value});
    c.what = fmt::format("'{}' given twice, {} the original, as {}", f[after ? i : i + 1].first,
                         after ? "after" : "before", value);
    write_text(file, render(f));
  } else if (kind == "config.not_an_object") {
    const std::vector<std::string> bodies = {"", "\n", "[]", "null", "42", "\"config\"", "{", "}", "[{}]",
                                             std::string("\0{}", 3), "\xef\xbb\xbf" + text};
    const std::string body = pick(g, bodies);
    write_text(file, body);
    c.what = "replaced by " + json(body.substr(0, 12)).dump(-1, ' ', true, json::error_handler_t::replace);
    // A UTF-8 byte order mark before valid JSON: transformers (json.load of a utf-8 file)
    // refuses it; either is fine here.
    c.outcome = body.starts_with("\xef\xbb\xbf") ? Outcome::Either : Outcome::MustFail;
  } else if (kind == "config.huge_dimension") {
    // Valid numbers for config.json alone, but a model far larger than the weights, and
    // than memory: the file's shapes must be refused before the model is allocated.
    const std::vector<std::pair<std::string, std::string>> huge = {
        {"vocab_size", "100000000"},          {"vocab_size", "2147483647"}, {"hidden_size", "65536"},
        {"intermediate_size", "1000000000"},  {"max_position_embeddings", "1000000000"},
        {"type_vocab_size", "1000000000"},    {"num_hidden_layers", "1364"}, {"num_labels", "1048576"}};
    const auto& [k, v] = pick(g, huge);
    bool found = false;
    for (auto& [fk, fv] : f)
      if (fk == k) fv = v, found = true;
    if (!found) f.emplace_back(k, v);
    c.what = fmt::format("set '{}' to {}", k, v);
    write_text(file, render(f));
    c.names = {"config.json", "model.safetensors"};
    // estimate plans without allocating: a plan of a huge model is an answer.
    c.outcome = c.command == Command::Estimate ? Outcome::Either : Outcome::MustFail;
  }
  if (c.names == std::vector<std::string>{"config.json"}) c.names.push_back("model.safetensors");
}

// -------- model.safetensors

struct St {
  uint64_t n = 0;
  ordered_json header;
  std::string header_text, data;
};
St read_st(const std::string& path) {
  const std::string b = read_text(path);
  St s;
  std::memcpy(&s.n, b.data(), 8);
  s.header_text = b.substr(8, size_t(s.n));
  s.header = ordered_json::parse(s.header_text);
  s.data = b.substr(8 + size_t(s.n));
  return s;
}
void write_st(const std::string& path, const ordered_json& header, const std::string& data) {
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  const uint64_t n = h.size();
  std::string b(8, '\0');
  std::memcpy(b.data(), &n, 8);
  write_text(path, b + h + data);
}
std::vector<std::string> tensor_names(const ordered_json& h) {
  std::vector<std::string> names;
  for (const auto& [k, v] : h.items())
    if (k != "__metadata__") names.push_back(k);
  return names;
}
bool is_head(const std::string& name) { return name.starts_with("classifier.") || name.starts_with("bert.pooler."); }

void safetensors_case(Rng& g, Case& c, const std::string& kind) {
  const std::string file = c.model + "/model.safetensors";
  c.file = file;
  c.names = {"model.safetensors"};
  const std::string bytes = read_text(file);
  St s = read_st(file);
  const std::vector<std::string> names = tensor_names(s.header);
  const std::string name = pick(g, names);
  ordered_json& e = s.header[name];
  if (kind == "safetensors.truncate") {
    const size_t at = below(g, bytes.size());
    write_text(file, bytes.substr(0, at));
    c.what = fmt::format("truncated to {} of {} bytes", at, bytes.size());
    c.outcome = Outcome::MustFail;
  } else if (kind == "safetensors.header_length") {
    const uint64_t size = bytes.size();
    const std::vector<uint64_t> values = {0, 1, 2, s.n - 1, s.n - 3, s.n + 1, s.n + 8, size - 8, size - 7, size,
                                          uint64_t(1) << 32, uint64_t(1) << 63, ~uint64_t(0), g() % size};
    const uint64_t n = pick(g, values);
    std::string b = bytes;
    std::memcpy(b.data(), &n, 8);
    write_text(file, b);
    c.what = fmt::format("header length {} instead of {}", n, s.n);
    // A shorter length that only drops the header's padding spaces is still valid (the
    // data then starts earlier, and its last bytes are spare).
    bool only_padding = n < s.n;
    for (uint64_t i = n; only_padding && i < s.n; ++i) only_padding = s.header_text[size_t(i)] == ' ';
    c.outcome = only_padding || n == s.n ? Outcome::Either : Outcome::MustFail;
    // Then every weight is read a byte off: whatever that gives (a loss of NaN) ends the run.
    if (only_padding) c.names_required = false;
  } else if (kind == "safetensors.header_bytes") {
    const size_t k = 1 + below(g, 3);
    write_text(file, flip_bytes(g, bytes, k, 8, 8 + size_t(s.n)));
    c.what = fmt::format("{} random bytes of the header JSON overwritten", k);
  } else if (kind == "safetensors.dtype") {
    const std::vector<ordered_json> dtypes = {"F16", "BF16", "I32", "I64", "U8", "F64", "BOOL", "F8_E4M3", "XYZ",
                                              "",    "f32",  5,     nullptr, ordered_json::array({"F32"})};
    const ordered_json d = pick(g, dtypes);
    e["dtype"] = d;
    write_st(file, s.header, s.data);
    c.what = fmt::format("tensor '{}' dtype {}", name, d.dump());
    // I32 has F32's size: the file is consistent, its values integers.
    c.outcome = d == "I32" ? Outcome::Either : Outcome::MustFail;
  } else if (kind == "safetensors.shape") {
    ordered_json shape = e["shape"];
    const ordered_json before = shape;
    switch (below(g, 10)) {
      case 0:
        if (shape.size() == 2) std::swap(shape[0], shape[1]);
        break;
      case 1: shape[below(g, shape.size())] = shape[0].get<int64_t>() + 1; break;
      case 2: shape.erase(shape.size() - 1); break;
      case 3: shape.push_back(1); break;
      case 4: shape[0] = -1; break;
      case 5: shape[0] = int64_t(1) << 62; break;
      case 6: shape[0] = 1.5; break;
      case 7: shape[0] = "32"; break;
      case 8: shape = ordered_json::array(); break;
      default: shape = pick(g, std::vector<ordered_json>{nullptr, ordered_json::object(), "[32]", 32}); break;
    }
    e["shape"] = shape;
    write_st(file, s.header, s.data);
    c.what = fmt::format("tensor '{}' shape {} instead of {}", name, shape.dump(), before.dump());
    c.outcome = shape == before ? Outcome::Either : Outcome::MustFail;
  } else if (kind == "safetensors.data_offsets") {
    ordered_json off = e["data_offsets"];
    const uint64_t b = off[0], end = off[1], data_size = s.data.size();
    const std::string other = pick(g, names);
    switch (below(g, 9)) {
      case 0: off = s.header[other]["data_offsets"]; break;  // overlapping (or of another size)
      case 1: off = {b + 4, end + 4}; break;
      case 2: off = {b >= 4 ? b - 4 : b + 1, b >= 4 ? end - 4 : end + 1}; break;
      case 3: off = {b, data_size + 4}; break;
      case 4: off = {end, b}; break;
      case 5: off = {-4, end}; break;
      case 6: off = {b, end, end}; break;
      case 7: off = {double(b), double(end) + 0.5}; break;
      default: off = {uint64_t(1) << 63, (uint64_t(1) << 63) + (end - b)}; break;
    }
    const bool same = off == e["data_offsets"];
    e["data_offsets"] = off;
    write_st(file, s.header, s.data);
    c.what = fmt::format("tensor '{}' data_offsets {} (data section {} bytes)", name, off.dump(), data_size);
    c.outcome = same ? Outcome::Either : Outcome::MustFail;
  } else if (kind == "safetensors.header_number") {
    // A number of the header (a dimension, an offset) written as what no count can be.
    std::vector<std::pair<size_t, size_t>> numbers;  // [begin, end) of each digit run after '[' or ','
    for (size_t i = 1; i < s.header_text.size(); ++i)
      if (std::isdigit((unsigned char)s.header_text[i]) && (s.header_text[i - 1] == '[' || s.header_text[i - 1] == ',')) {
        size_t j = i;
        while (j < s.header_text.size() && std::isdigit((unsigned char)s.header_text[j])) ++j;
        numbers.emplace_back(i, j);
      }
    const auto [b, end] = pick(g, numbers);
    const std::string v = pick(g, std::vector<std::string>{"1e400", "-1e400", "1.5", "1e5", "-0", "-1",
                                                           "18446744073709551616", "99999999999999999999999",
                                                           "0x10", "Infinity", "NaN"});
    std::string h = s.header_text.substr(0, b) + v + s.header_text.substr(end);
    h.append((8 - h.size() % 8) % 8, ' ');
    const uint64_t n = h.size();
    std::string out(8, '\0');
    std::memcpy(out.data(), &n, 8);
    write_text(file, out + h + s.data);
    c.what = fmt::format("header number {} written as {}", s.header_text.substr(b, end - b), v);
    // -0 is an integer, 0, to a JSON reader; the rest are no count.
    c.outcome = v == "-0" ? Outcome::Either : Outcome::MustFail;
  } else if (kind == "safetensors.remove_tensor") {
    s.header.erase(name);
    write_st(file, s.header, s.data);
    c.what = fmt::format("tensor '{}' removed from the header", name);
    // transformers initialises a missing pooler or classifier anew; predicting needs them.
    c.outcome = is_head(name) && c.command != Command::Predict ? Outcome::Either : Outcome::MustFail;
  } else if (kind == "safetensors.rename_tensor") {
    // Old checkpoints' names (LayerNorm gamma/beta, no "bert." prefix) are the same
    // parameters; a name that is no parameter leaves one missing; a second name for one
    // parameter gives it twice.
    std::string renamed = name;
    Outcome outcome = Outcome::MustSucceed;
    bool keep_old = false;
    const int v = int(below(g, 4));
    if (v == 0 && name.ends_with("LayerNorm.weight")) {
      renamed = name.substr(0, name.size() - 6) + "gamma";
    } else if (v == 0 && name.ends_with("LayerNorm.bias")) {
      renamed = name.substr(0, name.size() - 4) + "beta";
    } else if (v <= 1 && name.starts_with("bert.")) {
      renamed = name.substr(5);
    } else if (v == 2) {
      renamed = name + ".junk";
      outcome = is_head(name) && c.command != Command::Predict ? Outcome::Either : Outcome::MustFail;
    } else {
      renamed = name.starts_with("bert.") ? name.substr(5) : "bert." + name;
      keep_old = true;  // the old name too
      outcome = name.starts_with("bert.") ? Outcome::MustFail : Outcome::Either;
    }
    ordered_json h = ordered_json::object();
    for (const auto& [k, val] : s.header.items()) {
      if (k != name || keep_old) h[k] = val;
      if (k == name) h[renamed] = val;
    }
    if (keep_old && renamed == name) outcome = Outcome::Either;
    write_st(file, h, s.data);
    c.what = fmt::format("tensor '{}' renamed '{}'{}", name, renamed, keep_old ? " (and kept)" : "");
    c.outcome = outcome;
  } else if (kind == "safetensors.metadata") {
    const std::vector<ordered_json> metas = {ordered_json::object({{"format", "pt"}, {"extra", "x"}}),
                                             ordered_json::object({{"format", 5}}), "pt", ordered_json::array(),
                                             nullptr, ordered_json::object({{"format", nullptr}})};
    const ordered_json m = pick(g, metas);
    ordered_json h = ordered_json::object();
    h["__metadata__"] = m;
    for (const auto& [k, val] : s.header.items())
      if (k != "__metadata__") h[k] = val;
    write_st(file, h, s.data);
    c.what = fmt::format("__metadata__ {}", m.dump());
    c.outcome = m.is_object() && m["format"].is_string() ? Outcome::MustSucceed : Outcome::MustFail;
  }
}

// NaN or infinity in a weight. (Kept apart: the check at load time is another branch's.)
void nonfinite_case(Rng& g, Case& c) {
  const std::string file = c.model + "/model.safetensors";
  c.file = file;
  c.names = {"model.safetensors"};
  St s = read_st(file);
  const std::vector<std::string> names = tensor_names(s.header);
  const std::string name = pick(g, names);
  const uint64_t b = s.header[name]["data_offsets"][0], end = s.header[name]["data_offsets"][1];
  const size_t count = size_t(end - b) / 4;
  const std::vector<float> values = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                                     -std::numeric_limits<float>::infinity()};
  const float v = pick(g, values);
  const size_t at = below(g, count);
  std::memcpy(s.data.data() + b + at * 4, &v, 4);
  write_st(file, s.header, s.data);
  c.kind = "safetensors.non_finite";
  c.what = fmt::format("tensor '{}' element {} set to {}", name, at, v);
  c.outcome = Outcome::MustFail;
}

// -------- tokenizer files

// A path into a JSON document to a random node (not the root).
std::vector<ordered_json*> nodes(ordered_json& j) {
  std::vector<ordered_json*> out;
  std::function<void(ordered_json&)> walk = [&](ordered_json& n) {
    if (!n.is_structured()) return;
    for (auto& child : n) {
      out.push_back(&child);
      walk(child);
    }
  };
  walk(j);
  return out;
}

void tokenizer_case(Rng& g, Case& c, const std::string& kind, bool vocab_model) {
  c.names = {"vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"};
  c.kind = kind + (vocab_model ? " (vocab.txt)" : " (tokenizer.json)");
  const std::vector<std::string> files = vocab_model
                                             ? std::vector<std::string>{"vocab.txt", "tokenizer_config.json",
                                                                        "special_tokens_map.json"}
                                             : std::vector<std::string>{"tokenizer.json", "tokenizer_config.json"};
  const std::vector<std::string> json_files =
      vocab_model ? std::vector<std::string>{"tokenizer_config.json", "special_tokens_map.json"}
                  : std::vector<std::string>{"tokenizer.json", "tokenizer_config.json"};
  auto path = [&](const std::string& f) { return c.model + "/" + f; };
  if (kind == "tokenizer.truncate") {
    const std::string f = pick(g, files);
    c.file = path(f);
    const std::string text = read_text(c.file);
    if (f == "vocab.txt") {
      const size_t at = below(g, text.size());
      write_text(c.file, text.substr(0, at));
      c.what = fmt::format("{} truncated to {} of {} bytes", f, at, text.size());
      // The special tokens come first: cut before [SEP] is whole, the tokenizer cannot work.
      c.outcome = at + 1 < text.find("[MASK]") ? Outcome::MustFail : Outcome::Either;
    } else {
      std::string what;
      write_text(c.file, truncate_json(g, text, &what));
      c.what = f + " " + what;
      c.outcome = Outcome::MustFail;
    }
  } else if (kind == "tokenizer.flip_bytes") {
    const std::string f = pick(g, files);
    c.file = path(f);
    const size_t n = 1 + below(g, 3);
    write_text(c.file, flip_bytes(g, read_text(c.file), n));
    c.what = fmt::format("{}: {} random bytes overwritten", f, n);
  } else if (kind == "tokenizer.wrong_value") {
    const std::string f = pick(g, json_files);
    c.file = path(f);
    ordered_json j = ordered_json::parse(read_text(c.file));
    std::vector<ordered_json*> all = nodes(j);
    ordered_json* n = pick(g, all);
    const std::string before = n->dump();
    std::string value = pick(g, kJsonValues);
    if (value == "NaN" || value == "Infinity" || value == "1e400") value = "-7";
    *n = ordered_json::parse(value);
    write_text(c.file, j.dump(2));
    c.what = fmt::format("{}: a value {} replaced by {}", f, before.substr(0, 40), value);
  } else if (kind == "tokenizer.missing_special") {
    const std::string tok = pick(g, kSpecials);
    const bool needed = tok != "[MASK]";
    if (vocab_model) {
      c.file = path("vocab.txt");
      std::string text = read_text(c.file);
      text.erase(text.find(tok + "\n"), tok.size() + 1);
      write_text(c.file, text);
      c.what = "vocab.txt without " + tok;
      c.outcome = needed ? Outcome::MustFail : Outcome::Either;
    } else {
      c.file = path("tokenizer.json");
      ordered_json j = ordered_json::parse(read_text(c.file));
      const int where = int(below(g, 3));  // the vocabulary, the added tokens, both
      if (where != 1) j["model"]["vocab"].erase(tok);
      if (where != 0) {
        ordered_json added = ordered_json::array();
        for (const auto& a : j["added_tokens"])
          if (a["content"] != tok) added.push_back(a);
        j["added_tokens"] = added;
      }
      write_text(c.file, j.dump(2));
      c.what = fmt::format("tokenizer.json without {} in {}", tok,
                           where == 0 ? "model.vocab" : where == 1 ? "added_tokens" : "model.vocab and added_tokens");
      // [UNK] must be in the model's vocabulary; [CLS], [SEP] and [PAD] are found in the
      // added tokens or the vocabulary.
      c.outcome = (tok == "[UNK]" && where != 1) || (needed && where == 2) ? Outcome::MustFail : Outcome::Either;
    }
  } else if (kind == "tokenizer.duplicate_token") {
    if (vocab_model) {
      c.file = path("vocab.txt");
      std::string text = read_text(c.file);
      std::vector<size_t> starts{0};
      for (size_t i = 0; i + 1 < text.size(); ++i)
        if (text[i] == '\n') starts.push_back(i + 1);
      const size_t from = pick(g, starts), to = pick(g, starts);
      const std::string line = text.substr(from, text.find('\n', from) - from + 1);
      text.insert(to, line);
      write_text(c.file, text);
      c.what = fmt::format("vocab.txt: {} repeated", json(line).dump());
      // One line more than the model's vocab_size.
      c.outcome = Outcome::MustFail;
    } else {
      c.file = path("tokenizer.json");
      const std::string text = read_text(c.file);
      ordered_json j = ordered_json::parse(text);
      std::vector<std::string> toks;
      for (const auto& [k, v] : j["model"]["vocab"].items()) toks.push_back(k);
      const std::string a = pick(g, toks), b = pick(g, toks);
      if (coin(g)) {
        j["model"]["vocab"][a] = j["model"]["vocab"][b];
        write_text(c.file, j.dump(2));
        c.what = fmt::format("tokenizer.json: '{}' given the id of '{}'", a, b);
      } else {
        // The same key twice in the vocabulary object.
        std::string t = j.dump(2);
        const std::string key = json(a).dump() + ": ";
        const size_t at = t.find(key, t.find("\"vocab\""));
        t.insert(at, key + std::to_string(below(g, 40)) + ",\n      ");
        write_text(c.file, t);
        c.what = fmt::format("tokenizer.json: vocabulary key '{}' twice", a);
      }
    }
  } else if (kind == "tokenizer.special_token_value") {
    const std::string f = vocab_model ? pick(g, std::vector<std::string>{"tokenizer_config.json",
                                                                         "special_tokens_map.json"})
                                      : "tokenizer_config.json";
    c.file = path(f);
    ordered_json j = ordered_json::parse(read_text(c.file));
    const std::string key = pick(g, std::vector<std::string>{"cls_token", "sep_token", "pad_token", "unk_token",
                                                             "mask_token"});
    const std::vector<ordered_json> values = {"[NOPE]",
                                              5,
                                              ordered_json::array(),
                                              ordered_json::object(),
                                              ordered_json::object({{"content", 5}}),
                                              ordered_json::object({{"content", "[CLS]"}}),
                                              nullptr,
                                              ""};
    const ordered_json v = pick(g, values);
    j[key] = v;
    write_text(c.file, j.dump(2));
    c.what = fmt::format("{}: {} = {}", f, key, v.dump());
    const bool wrong_type = !(v.is_string() || v.is_null() || (v.is_object() && v.contains("content") &&
                                                                v["content"].is_string()));
    // A name not in the vocabulary, for a token the tokenizer needs: an error. (Without
    // vocab.txt, [UNK] is the WordPiece model's own.)
    const bool needed = key != "mask_token" && (vocab_model || key != "unk_token");
    // special_tokens_map.json wins over tokenizer_config.json, and names every token.
    const bool overridden = vocab_model && f == "tokenizer_config.json";
    // (An empty name is no name: BertTokenizer's default stands, or no token is found.)
    const bool missing = v.is_string() && v != "[CLS]" && v != "" && !overridden;
    c.outcome = wrong_type || (needed && missing) ? Outcome::MustFail : Outcome::Either;
  } else if (kind == "tokenizer.bad_id") {
    c.file = path(vocab_model ? "tokenizer_config.json" : "tokenizer.json");
    ordered_json j = ordered_json::parse(read_text(c.file));
    const std::vector<ordered_json> ids = {2147483647, 1000000000, 4294967296ll, -1, 1.5, "3", nullptr, 100000};
    const ordered_json id = pick(g, ids);
    if (vocab_model) {
      // An added token at an id given as the key of added_tokens_decoder.
      j["added_tokens_decoder"] = {{id.is_string() ? id.get<std::string>() : id.dump(),
                                    {{"content", "[NEW]"}, {"special", true}, {"normalized", false}}}};
      c.what = fmt::format("tokenizer_config.json: added_tokens_decoder key {}", id.dump());
    } else {
      const int where = int(below(g, 3));
      if (where == 0) {
        std::vector<std::string> toks;
        for (const auto& [k, v] : j["model"]["vocab"].items()) toks.push_back(k);
        const std::string t = pick(g, toks);
        j["model"]["vocab"][t] = id;
        c.what = fmt::format("tokenizer.json: vocabulary id of '{}' = {}", t, id.dump());
      } else if (where == 1) {
        j["added_tokens"][below(g, j["added_tokens"].size())]["id"] = id;
        c.what = fmt::format("tokenizer.json: an added token's id = {}", id.dump());
      } else {
        j["post_processor"]["special_tokens"]["[CLS]"]["ids"] = {id};
        c.what = fmt::format("tokenizer.json: post_processor [CLS] id = {}", id.dump());
      }
    }
    write_text(c.file, j.dump(2));
    // Every id here is beyond the model's vocabulary, negative, or not an integer (except
    // the key "3" of added_tokens_decoder, which is a JSON object's key as it should be).
    c.outcome = vocab_model && id == "3" ? Outcome::Either : Outcome::MustFail;
  }
}

// -------- data files

void data_case(Rng& g, Case& c, const std::string& kind) {
  const std::string ext = c.train_file.substr(c.train_file.rfind('.') + 1);
  c.file = c.train_file;
  // A new label in the data makes a classifier of another shape: the error is then about
  // the weights, and says what to do.
  c.names = {fs::path(c.train_file).filename().string(), "--ignore_mismatched_sizes"};
  const std::string text = read_text(c.file);
  std::vector<std::string> lines;
  for (size_t pos = 0; pos < text.size();) {
    const size_t nl = text.find('\n', pos);
    lines.push_back(text.substr(pos, nl - pos));
    pos = nl + 1;
  }
  auto join = [](const std::vector<std::string>& ls) {
    std::string s;
    for (const auto& l : ls) s += l + "\n";
    return s;
  };
  const bool jsonl = ext == "jsonl";
  const char sep = ext == "tsv" ? '\t' : ',';
  const bool predict = c.command == Command::Predict;
  if (kind == "data.truncate") {
    const size_t at = below(g, text.size());
    write_text(c.file, text.substr(0, at));
    c.what = fmt::format("truncated to {} of {} bytes", at, text.size());
    // Cut before the first row is whole (before its label for CSV and TSV): no row.
    c.outcome = (jsonl ? at < lines[0].size() : at <= lines[0].size() + 1 + lines[1].size() / 2) ? Outcome::MustFail
                                                                                                   : Outcome::Either;
  } else if (kind == "data.random_bytes") {
    const size_t n = 1 + below(g, 6);
    write_text(c.file, flip_bytes(g, text, n));
    c.what = fmt::format("{} random bytes overwritten", n);
  } else if (kind == "data.missing_column") {
    const bool label = coin(g);
    const std::string col = label ? "label" : "sentence";
    const bool every_line = coin(g);
    if (jsonl) {
      const size_t one = below(g, lines.size());
      for (size_t i = 0; i < lines.size(); ++i)
        if (every_line || i == one) {
          json j = json::parse(lines[i]);
          j.erase(col);
          lines[i] = j.dump();
        }
      c.what = fmt::format("no \"{}\" on {}", col, every_line ? "any line" : fmt::format("line {}", one + 1));
    } else if (every_line) {
      lines[0] = label ? "sentence" + std::string(1, sep) + "lable" : "text" + std::string(1, sep) + "label";
      c.what = fmt::format("header without \"{}\"", col);
    } else {
      const size_t one = 1 + below(g, lines.size() - 1);
      // Rows are "text<sep>label": cut the last field, or leave one field too many.
      const size_t cut = lines[one].rfind(sep);
      lines[one] = coin(g) ? lines[one].substr(0, cut) : lines[one] + sep + "extra";
      c.what = fmt::format("line {} with a field too few or too many", one + 1);
    }
    write_text(c.file, join(lines));
    // predict reads a file without labels (or with a broken label column) without metrics.
    c.outcome = predict && label ? Outcome::Either : Outcome::MustFail;
    if (!jsonl && !every_line) c.outcome = Outcome::MustFail;
  } else if (kind == "data.empty") {
    const std::string body = pick(g, std::vector<std::string>{"", "\n", "\n\n\n", "   \n", "\r\n"});
    write_text(c.file, body);
    c.what = fmt::format("file holds only {}", json(body).dump());
    c.outcome = Outcome::MustFail;
  } else if (kind == "data.header_only") {
    write_text(c.file, jsonl ? pick(g, std::vector<std::string>{"{}\n", "[]\n", "\"sentence\"\n", "null\n"})
                             : lines[0] + (coin(g) ? "\n" : ""));
    c.what = jsonl ? "a single line that is no row" : "the header line alone";
    c.outcome = Outcome::MustFail;
  } else if (kind == "data.wrong_type") {
    const size_t one = jsonl ? below(g, lines.size()) : 1 + below(g, lines.size() - 1);
    const bool label = coin(g);
    if (jsonl) {
      // (1e400 overflows a double: nlohmann's parser throws out_of_range for it.)
      const std::vector<std::string> values = {"1.5", "1", "-3", "true", "null", "[]", "{}", "\"\"",
                                               "\"" + std::string(1000, 'x') + "\"", "NaN", "1e400"};
      const std::string v = pick(g, values);
      const std::string l = ordered_json::parse(lines[one]).dump();  // {"sentence":...,"label":...}
      const std::string key = json(label ? "label" : "sentence").dump() + ":";
      const size_t at = l.find(key) + key.size();
      const size_t end = label ? l.size() - 1 : l.find(",\"label\"");
      lines[one] = l.substr(0, at) + v + l.substr(end);
      c.what = fmt::format("line {}: \"{}\" is {}", one + 1, label ? "label" : "sentence", v.substr(0, 20));
      const bool is_string = v.starts_with("\"");
      const bool valid_label = (is_string && v != "\"\"") || v == "1.5" || v == "1" || v == "-3" || v == "true";
      c.outcome = label ? (valid_label || predict ? Outcome::Either : Outcome::MustFail)
                        : (is_string ? Outcome::Either : Outcome::MustFail);
    } else {
      const std::vector<std::string> values = {"", "1.5", "nan", "inf", "-", std::string(1000, 'x'), "\"\"",
                                               "\"unclosed"};
      const std::string v = pick(g, values);
      const size_t cut = lines[one].rfind(sep);
      lines[one] = label ? lines[one].substr(0, cut + 1) + v : v + lines[one].substr(cut);
      c.what = fmt::format("line {}: {} is {}", one + 1, label ? "the label" : "the text", json(v.substr(0, 20)).dump());
    }
    write_text(c.file, join(lines));
  } else if (kind == "data.huge_line") {
    // A line of megabytes: truncated to max_seq_length when tokenized, in bounded time.
    const size_t one = jsonl ? below(g, lines.size()) : 1 + below(g, lines.size() - 1);
    std::string big;
    const int v = int(below(g, 3));
    Rng w(g());
    while (big.size() < (size_t(3) << 20)) {
      if (v == 0) big += pick(w, kWords) + " ";       // many words
      else if (v == 1) big += "abcdefgh";              // one word of megabytes
      else big += "\xe4\xb8\xad\xe6\x96\x87 ";         // CJK, each character a word
    }
    if (jsonl) {
      lines[one] = json{{"sentence", big}, {"label", "positive"}}.dump();
    } else {
      lines[one] = (sep == ',' ? "\"" + big + "\"" : big) + sep + "positive";  // the words hold commas
    }
    write_text(c.file, join(lines));
    c.what = fmt::format("line {}: a text of {} MB ({})", one + 1, big.size() >> 20,
                         v == 0 ? "words" : v == 1 ? "one word" : "CJK characters");
    c.outcome = Outcome::MustSucceed;
  }
}

// -------- whole files: missing, or a directory in their place

void file_case(Rng& g, Case& c, const std::string& kind) {
  const bool vocab_model = fs::exists(c.model + "/vocab.txt");
  std::vector<std::string> files = {c.model + "/config.json", c.model + "/model.safetensors",
                                    c.model + "/tokenizer_config.json", c.train_file};
  if (vocab_model) files.insert(files.end(), {c.model + "/vocab.txt", c.model + "/special_tokens_map.json"});
  else files.push_back(c.model + "/tokenizer.json");
  c.file = pick(g, files);
  const std::string name = fs::path(c.file).filename().string();
  fs::remove(c.file);
  if (kind == "file.directory") {
    fs::create_directories(c.file + "/sub");  // not empty, as a directory where a file should be can be
    c.what = name + " is a directory";
    c.outcome = Outcome::MustFail;
    c.must_say = "directory";
  } else {
    c.what = name + " is missing";
    // transformers' defaults stand in for the tokenizer's optional files.
    const bool optional = name == "tokenizer_config.json" || name == "special_tokens_map.json";
    c.outcome = optional ? Outcome::Either : Outcome::MustFail;
  }
  c.names = {name};
  // Without the vocabulary file the directory has no tokenizer: the message names both kinds.
  if (name == "vocab.txt" || name == "tokenizer.json") c.names = {"vocab.txt", "tokenizer.json"};
}

// ---------------------------------------------------------------- running a case

struct Kind {
  const char* name;
  void (*make)(Rng&, Case&, const std::string&);
  std::vector<Command> commands;  // drawn from for each case
};

void tok_vocab(Rng& g, Case& c, const std::string& k) { tokenizer_case(g, c, k, true); }
void tok_json(Rng& g, Case& c, const std::string& k) { tokenizer_case(g, c, k, false); }

const std::vector<Kind>& kinds() {
  using C = Command;
  const std::vector<C> all = {C::Train, C::Train, C::Predict, C::Estimate, C::ConfigName};
  const std::vector<C> weights = {C::Train, C::Train, C::Predict};
  const std::vector<C> text = {C::Train, C::Train, C::Predict, C::Estimate};
  const std::vector<C> data = {C::Train, C::Train, C::Predict};
  static const std::vector<Kind> k = {
      {"config.delete_field", config_case, all},          {"config.wrong_value", config_case, all},
      {"config.truncate", config_case, all},              {"config.flip_bytes", config_case, all},
      {"config.unknown_field", config_case, all},         {"config.duplicate_key", config_case, all},
      {"config.not_an_object", config_case, all},         {"config.huge_dimension", config_case, all},
      {"safetensors.truncate", safetensors_case, weights},
      {"safetensors.header_length", safetensors_case, weights},
      {"safetensors.header_bytes", safetensors_case, weights},
      {"safetensors.dtype", safetensors_case, weights},
      {"safetensors.shape", safetensors_case, weights},
      {"safetensors.data_offsets", safetensors_case, weights},
      {"safetensors.header_number", safetensors_case, weights},
      {"safetensors.remove_tensor", safetensors_case, weights},
      {"safetensors.rename_tensor", safetensors_case, weights},
      {"safetensors.metadata", safetensors_case, weights},
      {"tokenizer.truncate", tok_vocab, text},            {"tokenizer.truncate", tok_json, text},
      {"tokenizer.flip_bytes", tok_vocab, text},          {"tokenizer.flip_bytes", tok_json, text},
      {"tokenizer.wrong_value", tok_vocab, text},         {"tokenizer.wrong_value", tok_json, text},
      {"tokenizer.missing_special", tok_vocab, text},     {"tokenizer.missing_special", tok_json, text},
      {"tokenizer.duplicate_token", tok_vocab, text},     {"tokenizer.duplicate_token", tok_json, text},
      {"tokenizer.special_token_value", tok_vocab, text}, {"tokenizer.special_token_value", tok_json, text},
      {"tokenizer.bad_id", tok_vocab, text},              {"tokenizer.bad_id", tok_json, text},
      {"data.truncate", data_case, data},                 {"data.random_bytes", data_case, data},
      {"data.missing_column", data_case, data},           {"data.empty", data_case, data},
      {"data.header_only", data_case, data},              {"data.wrong_type", data_case, data},
      {"data.huge_line", data_case, data},
      {"file.missing", file_case, weights},               {"file.directory", file_case, weights},
  };
  return k;
}

// A case's inputs: copies of the base files under `dir`.
Case new_case(const std::string& dir, bool vocab_model, const std::string& data_ext, Command command) {
  Case c;
  c.dir = dir;
  c.command = command;
  c.model = dir + "/model";
  c.cfg_dir = dir + "/cfg";
  c.out = dir + "/out";
  fs::create_directories(dir);
  fs::copy(vocab_model ? base().vocab_model : base().json_model, c.model);
  if (command == Command::ConfigName) {
    fs::create_directories(c.cfg_dir);
    fs::copy_file(c.model + "/config.json", c.cfg_dir + "/config.json");
  }
  c.train_file = dir + "/train." + data_ext;
  fs::copy_file(base().data + "/train." + data_ext, c.train_file);
  return c;
}

std::vector<std::string> args_of(const Case& c) {
  std::vector<std::string> a;
  const std::vector<std::string> common = {"--device", "cpu", "--max_seq_length", "16", "--output_dir", c.out,
                                           "--disable_tqdm", "true"};
  switch (c.command) {
    case Command::Train:
    case Command::ConfigName:
      a = {"train", "--model_name_or_path", c.model, "--train_file", c.train_file, "--max_steps", "2",
           "--per_device_train_batch_size", "4", "--save_strategy", "no", "--logging_steps", "1"};
      if (c.command == Command::ConfigName) a.insert(a.end(), {"--config_name", c.cfg_dir + "/config.json"});
      break;
    case Command::Predict:
      a = {"predict", "--model_name_or_path", c.model, "--test_file", c.train_file, "--per_device_eval_batch_size",
           "4"};
      break;
    case Command::Estimate:
      a = {"estimate", "--model_name_or_path", c.model, "--train_file", c.train_file, "--per_device_train_batch_size",
           "4"};
      break;
  }
  a.insert(a.end(), common.begin(), common.end());
  return a;
}

std::string shell_line(const std::vector<std::string>& args) {
  std::string s = "OMP_NUM_THREADS=1 " + hone_binary();
  for (const auto& a : args) s += " '" + a + "'";
  return s;
}

// Whether the last `hone: error: ` line names one of the case's files.
bool names_a_file(const Case& c, const std::string& out) {
  const size_t at = out.rfind("hone: error: ");
  if (at == std::string::npos) return false;
  for (const std::string& n : c.names)
    if (out.find(n, at) != std::string::npos) return true;
  return false;
}

// What is wrong with how the case ended; empty when nothing is.
std::string judge(const Case& c, const Child& r, double timeout_s) {
  if (r.timed_out) return fmt::format("still running after {:.0f} s: killed (a hang, or work sized by the damage)", timeout_s);
  if (r.signal)
    return fmt::format("killed by signal {} ({})", r.signal, strsignal(r.signal));
  if (r.code == 127 && r.out.find("fuzz: cannot execute") != std::string::npos)
    return "could not run " + hone_binary() + " (rebuilt while the test ran?)";
  for (const char* bad : {"internal error", "terminate called", "what():", "AddressSanitizer", "LeakSanitizer",
                          "UndefinedBehaviorSanitizer", "runtime error:", "Segmentation fault", "core dumped",
                          "out of host memory", "std::bad_alloc", "basic_string", "vector::"})
    if (r.out.find(bad) != std::string::npos)
      return fmt::format("the output has '{}'{}", bad,
                         std::string(bad) == "out of host memory"
                             ? " (under the HONE_FUZZ_MEMORY_GB address-space limit: something was sized by "
                               "the damaged input before it was checked)"
                             : "");
  if (r.code == 0) {
    if (c.outcome == Outcome::MustFail) return "exit 0, but the input is invalid";
    if (c.after_success) return c.after_success(c);
    return "";
  }
  if (c.outcome == Outcome::MustSucceed) return fmt::format("exit {}, but the input is valid", r.code);
  const size_t at = r.out.rfind("hone: error: ");
  if (at == std::string::npos || (at > 0 && r.out[at - 1] != '\n'))
    return fmt::format("exit {} without a line starting 'hone: error: '", r.code);
  const std::string message = r.out.substr(at + 13);
  if (message.find_first_not_of(" \n") == std::string::npos) return "an empty error message";
  if (!c.must_say.empty() && message.find(c.must_say) == std::string::npos)
    return "the error does not say '" + c.must_say + "'";
  for (const std::string& n : c.names)
    if (message.find(n) != std::string::npos) return "";
  if (!c.names_required) return "";
  std::string names;
  for (const std::string& n : c.names) names += (names.empty() ? "" : " or ") + n;
  return "the error does not name the file involved (" + names + ")";
}

struct Tally {
  int runs = 0, ok = 0, errors = 0, failures = 0, unnamed = 0;
  double seconds = 0, slowest = 0;
};

// Runs cases [0, count) of `seed` (or only case HONE_FUZZ_ONLY), each made by `make_case`
// (a fresh copy of the inputs with one mutation) until `budget_s` seconds have passed;
// every case that does not end as it must is a failure; prints a tally per kind.
void run_cases(const std::string& suite, uint64_t seed, uint64_t count, double budget_s,
               const std::function<void(Rng&, Case&, size_t index)>& make_case) {
  const double timeout_s = double(env_u64("HONE_FUZZ_TIMEOUT", 20));
  const char* only_env = std::getenv("HONE_FUZZ_ONLY");
  const bool one = only_env && *only_env;
  const uint64_t only = env_u64("HONE_FUZZ_ONLY", 0);
  const char* keep = std::getenv("HONE_FUZZ_KEEP");
  const bool verbose = env_u64("HONE_FUZZ_VERBOSE", 0) != 0;  // each case's outcome, one line
  std::printf("[ fuzz ] %s: HONE_FUZZ_SEED=%llu HONE_FUZZ_CASES=%llu HONE_FUZZ_SECONDS=%.0f%s\n", suite.c_str(),
              (unsigned long long)seed, (unsigned long long)count, budget_s,
              one ? fmt::format(" HONE_FUZZ_ONLY={}", only).c_str() : "");
  std::fflush(stdout);
  test::TempDir tmp;
  std::map<std::string, Tally> tally;
  const auto start = Clock::now();
  uint64_t run = 0;
  int shown = 0;
  for (uint64_t i = one ? only : 0; i < (one ? only + 1 : count); ++i) {
    if (std::chrono::duration<double>(Clock::now() - start).count() > budget_s) {
      std::printf("[ fuzz ] time budget of %.0f s spent: %llu of %llu cases run\n", budget_s,
                  (unsigned long long)run, (unsigned long long)count);
      break;
    }
    Rng g(splitmix(seed * 0x100000001B3ull + i));
    Case c;
    make_case(g, c, size_t(i));
    const std::vector<std::string> args = args_of(c);
    const Child r = run_hone(args, timeout_s);
    ++run;
    Tally& t = tally[c.kind];
    ++t.runs;
    t.seconds += r.seconds;
    t.slowest = std::max(t.slowest, r.seconds);
    const std::string wrong = judge(c, r, timeout_s);
    if (verbose) {
      const size_t at = r.out.rfind("hone: error: ");
      std::printf("case %llu %s (%s): %s -> %s\n", (unsigned long long)i, c.kind.c_str(), command_name(c.command),
                  c.what.c_str(),
                  r.code == 0 ? "exit 0" : at == std::string::npos ? "?" : r.out.substr(at, r.out.find('\n', at) - at).c_str());
    }
    if (r.code == 0 && wrong.empty()) ++t.ok;
    else if (wrong.empty()) ++t.errors;
    if (wrong.empty() && r.code != 0 && !names_a_file(c, r.out)) ++t.unnamed;
    if (!wrong.empty()) {
      ++t.failures;
      std::string kept;
      if (keep && *keep) {
        const std::string to = fmt::format("{}/{}-seed{}-case{}", keep, suite, seed, i);
        std::error_code ec;
        fs::create_directories(to, ec);
        fs::copy(c.dir, to, fs::copy_options::recursive | fs::copy_options::overwrite_existing, ec);
        kept = "\n  inputs kept in " + to;
      }
      const std::string tail = r.out.size() > 1500 ? "..." + r.out.substr(r.out.size() - 1500) : r.out;
      if (shown++ < 40)
        ADD_FAILURE() << fmt::format("case {} ({}, {}): {}\n  {}\n  reproduce: HONE_FUZZ_SEED={} HONE_FUZZ_ONLY={} "
                                     "hone_tests --gtest_filter={}.*\n  command: {}{}\n  output:\n{}",
                                     i, c.kind, command_name(c.command), c.what, wrong, seed, i, suite,
                                     shell_line(args), kept, tail);
      else
        ADD_FAILURE() << fmt::format("case {} ({}): {}: {}", i, c.kind, c.what, wrong);
    }
    std::error_code ec;
    fs::remove_all(c.dir, ec);
  }
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf("[ fuzz ] %s: %llu cases in %.1f s\n", suite.c_str(), (unsigned long long)run, wall);
  std::printf("  %-46s %5s %6s %6s %8s %6s %7s %6s\n", "kind", "runs", "exit0", "error", "unnamed", "FAIL",
              "mean s", "max s");
  for (const auto& [k, t] : tally)
    std::printf("  %-46s %5d %6d %6d %8d %6d %7.2f %6.2f\n", k.c_str(), t.runs, t.ok, t.errors, t.unnamed,
                t.failures, t.seconds / std::max(t.runs, 1), t.slowest);
  std::fflush(stdout);
}

// The case's directory comes from its index; the data format and model variant from its
// random stream.
Case make_base_case(Rng& g, const std::string& root, size_t i, const Kind& k) {
  const Command command = pick(g, k.commands);
  const bool vocab_model = k.make == tok_json ? false : k.make == tok_vocab ? true : coin(g);
  const std::string ext = pick(g, std::vector<std::string>{"csv", "tsv", "jsonl"});
  Case c = new_case(fmt::format("{}/case{}", root, i), vocab_model, ext, command);
  c.kind = k.name;
  return c;
}

TEST(InputFuzz, PristineInputsWork) {
  test::TempDir tmp;
  int n = 0;
  for (const bool vocab : {true, false})
    for (const char* ext : {"csv", "tsv", "jsonl"})
      for (const Command cmd : {Command::Train, Command::Predict, Command::Estimate, Command::ConfigName}) {
        Case c = new_case(fmt::format("{}/c{}", tmp.path, n++), vocab, ext, cmd);
        const Child r = run_hone(args_of(c), 60);
        EXPECT_TRUE(r.code == 0 && !r.signal && !r.timed_out)
            << command_name(cmd) << " on " << ext << (vocab ? " (vocab.txt)" : " (tokenizer.json)") << ": exit "
            << r.code << " signal " << r.signal << "\n" << shell_line(args_of(c)) << "\n" << r.out;
      }
}

TEST(InputFuzz, DamagedInputsEndInACleanErrorOrSuccess) {
  const uint64_t seed = env_u64("HONE_FUZZ_SEED", 19);
  const uint64_t count = env_u64("HONE_FUZZ_CASES", 2000);
  const double budget = double(env_u64("HONE_FUZZ_SECONDS", 150));
  test::TempDir root;
  run_cases("InputFuzz", seed, count, budget, [&](Rng& g, Case& c, size_t i) {
    const Kind& k = kinds()[i % kinds().size()];
    c = make_base_case(g, root.path, i, k);
    k.make(g, c, k.name);
  });
}

// NaN and infinity in the weights, kept apart from the cases above: hone refuses them as
// it loads the weights; each case must be a clean error naming model.safetensors.
TEST(InputFuzz, NonFiniteWeightsAreRefused) {
  const uint64_t seed = env_u64("HONE_FUZZ_SEED", 19);
  test::TempDir root;
  run_cases("InputFuzzNonFinite", seed, env_u64("HONE_FUZZ_NONFINITE_CASES", 24), 60,
            [&](Rng& g, Case& c, size_t i) {
              const std::vector<Command> cmds = {Command::Train, Command::Predict};
              c = new_case(fmt::format("{}/case{}", root.path, i), coin(g), "jsonl", pick(g, cmds));
              nonfinite_case(g, c);
            });
}

// A JSON Lines row with a number no double holds (1e400, which Python's json reads as
// inf): nlohmann throws out_of_range, not parse_error, and hone once died of
// std::terminate on it; it is a clean error naming the file and line.
TEST(InputFuzz, JsonLinesNumberOverflow) {
  test::TempDir root;
  for (const char* field : {"label", "sentence"}) {
    Case c = new_case(fmt::format("{}/{}", root.path, field), true, "jsonl", Command::Train);
    std::string text = read_text(c.train_file);
    const std::string key = fmt::format("\"{}\":", field);
    const size_t at = text.find(key) + key.size();
    const size_t end = text.find_first_of(",}", text.find('"', at + 1) + 1);
    text = text.substr(0, at) + "1e400" + text.substr(end);
    write_text(c.train_file, text);
    c.names = {"train.jsonl"};
    c.outcome = Outcome::MustFail;
    const Child r = run_hone(args_of(c), 20);
    const std::string wrong = judge(c, r, 20);
    EXPECT_TRUE(wrong.empty()) << field << ": " << wrong << "\n" << r.out;
    EXPECT_NE(r.out.find("train.jsonl:"), std::string::npos) << r.out;
  }
}

// ---------------------------------------------------------------- the checks the fuzz found missing

// A config error is the same on every path that reads a config.json: train, predict and
// estimate of a model directory, and --config_name (of a directory's model or a built-in
// one), each naming the file, the field, the value and the rule, before anything is
// allocated.
TEST(InputChecks, ConfigErrorsAreTheSameOnEveryPath) {
  test::TempDir root;
  const std::vector<std::pair<ordered_json, std::string>> bad = {
      {{{"hidden_size", "abc"}}, "field 'hidden_size' must be an integer, got string \"abc\""},
      {{{"hidden_size", 3.5}}, "field 'hidden_size' must be an integer, got number 3.5"},
      {{{"hidden_size", -1}}, "hidden_size must be >= 1, got -1"},
      {{{"num_attention_heads", 0}}, "num_attention_heads must be >= 1, got 0"},
      {{{"hidden_dropout_prob", 1.5}}, "hidden_dropout_prob must be in [0, 1), got 1.5"},
      {{{"model_type", "gpt2"}}, "model_type \"gpt2\" is not one hone implements"},
  };
  int n = 0;
  for (const auto& [change, message] : bad) {
    const std::string dir = fmt::format("{}/c{}", root.path, n++);
    Case c = new_case(dir, true, "csv", Command::Train);
    ordered_json j = ordered_json::parse(read_text(c.model + "/config.json"));
    j.update(change);
    write_text(c.model + "/config.json", j.dump(2));
    const std::string cfg = c.model + "/config.json";
    const std::string good = base().vocab_model;
    const std::vector<std::vector<std::string>> runs = {
        args_of(c),
        {"predict", "--model_name_or_path", c.model, "--test_file", c.train_file, "--device", "cpu", "--output_dir",
         c.out},
        {"estimate", "--model_name_or_path", c.model, "--train_file", c.train_file, "--device", "cpu"},
        {"train", "--model_name_or_path", good, "--config_name", c.model, "--train_file", c.train_file, "--max_steps",
         "1", "--device", "cpu", "--output_dir", c.out},
        {"estimate", "--model_name_or_path", "bert-tiny", "--config_name", cfg, "--device", "cpu"},
    };
    for (const auto& args : runs) {
      const Child r = run_hone(args, 20);
      EXPECT_TRUE(r.code == 1 && r.out.find("hone: error: " + cfg + ": " + message) != std::string::npos)
          << shell_line(args) << "\nexit " << r.code << ", expected: " << cfg << ": " << message << "\n" << r.out;
      // Refused as the config is read: nothing of the run was planned or printed.
      EXPECT_EQ(r.out.find("hone train:"), std::string::npos) << r.out;
    }
  }
}

// A config.json that describes a model far larger than its model.safetensors (a
// vocab_size of 10^9) is refused from the file's header: hone allocated the model first,
// and failed with "out of host memory" (or, where the allocation succeeded, with the
// machine's memory) before load_weights saw the shapes.
TEST(InputChecks, WeightsThatDoNotFitTheConfigAreRefusedBeforeAllocating) {
  test::TempDir root;
  const std::vector<std::pair<std::string, int>> huge = {{"vocab_size", 1000000000},
                                                         {"max_position_embeddings", 1000000000},
                                                         {"intermediate_size", 100000000},
                                                         {"num_hidden_layers", 1364}};
  int n = 0;
  for (const auto& [key, value] : huge)
    for (const Command cmd : {Command::Train, Command::Predict, Command::ConfigName}) {
      Case c = new_case(fmt::format("{}/c{}", root.path, n++), true, "jsonl", cmd);
      const std::string cfg = cmd == Command::ConfigName ? c.cfg_dir + "/config.json" : c.model + "/config.json";
      ordered_json j = ordered_json::parse(read_text(cfg));
      j[key] = value;
      write_text(cfg, j.dump(2));
      const Child r = run_hone(args_of(c), 20);
      const std::string expected =
          key == "num_hidden_layers" ? "lacks " : "has shape ";
      EXPECT_TRUE(r.code == 1 && r.out.find("hone: error: " + c.model + "/model.safetensors: ") != std::string::npos &&
                  r.out.find(expected) != std::string::npos && r.out.find("out of host memory") == std::string::npos)
          << key << " = " << value << ", " << command_name(cmd) << ": exit " << r.code << "\n" << r.out;
    }
}

// A tokenizer with more tokens than the model's vocab_size: the error named only the
// directory ("the tokenizer of DIR has 22 tokens"); it names the vocabulary file and the
// config.json now.
TEST(InputChecks, ATokenizerLargerThanTheModelNamesBothFiles) {
  test::TempDir root;
  for (const bool vocab : {true, false}) {
    Case c = new_case(root.path + (vocab ? "/v" : "/j"), vocab, "csv", Command::Train);
    ordered_json j = ordered_json::parse(read_text(c.model + "/config.json"));
    j["vocab_size"] = int(kSpecials.size() + kWords.size()) - 1;
    write_text(c.model + "/config.json", j.dump(2));
    const Child r = run_hone(args_of(c), 20);
    const std::string file = c.model + (vocab ? "/vocab.txt" : "/tokenizer.json");
    EXPECT_NE(r.out.find("hone: error: " + file + " has 21 tokens but the model's vocab_size is 20 (" + c.model +
                         "/config.json)"),
              std::string::npos)
        << r.out;
  }
}

// A post-processor template whose token type id the model has no embedding for: the run
// stopped at its first batch ("batch row 0, position 1: token type 5 is out of range for
// type_vocab_size 2"), naming no file; it is refused with the inputs now.
TEST(InputChecks, TemplateTypeIdsBeyondTypeVocabSizeAreRefused) {
  test::TempDir root;
  Case c = new_case(root.path + "/c", false, "csv", Command::Train);
  ordered_json j = ordered_json::parse(read_text(c.model + "/tokenizer.json"));
  j["post_processor"]["pair"][3]["Sequence"]["type_id"] = 5;
  write_text(c.model + "/tokenizer.json", j.dump(2));
  const Child r = run_hone(args_of(c), 20);
  EXPECT_NE(r.out.find("hone: error: " + c.model + "/tokenizer.json: the post-processor gives token type id 5 but "
                       "the model's type_vocab_size is 2 (" + c.model + "/config.json)"),
            std::string::npos)
      << r.out;
}

}  // namespace
}  // namespace hone
