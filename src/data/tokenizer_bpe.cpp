// BPE as the crate's models/bpe: a word starts as its characters (each looked up, with the
// continuing_subword_prefix / end_of_word_suffix where set, else byte_fallback's <0xNN>
// tokens, else unk), then the pair of adjacent symbols whose merge has the lowest rank is
// merged, leftmost first among equal ranks, until no merge applies.
#include <fmt/format.h>

#include <queue>

#include "data/tokenizer_parts.h"
#include "hone/error.h"

namespace hone::tok {
namespace {

class Bpe final : public Model {
 public:
  std::optional<std::string> unk_token, prefix, suffix;
  bool fuse_unk = false, byte_fallback = false, ignore_merges = false;
  // (left id, right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<uint32_t, int32_t>> merges;

  static uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

  std::string_view type() const override { return "BPE"; }

  void tokenize(const std::u32string& word32, std::vector<int32_t>& ids,
                std::vector<std::string>* pieces) const override {
    if (word32.empty()) return;
    const std::string word = encode_utf8(word32);
    auto emit = [&](int32_t id) {
      ids.push_back(id);
      if (pieces) pieces->push_back(tokens[size_t(id)]);
    };
    if (ignore_merges)
      if (auto it = vocab.find(word); it != vocab.end()) return emit(it->second);

    struct Symbol {
      int32_t id;
      int prev, next;
      bool gone = false;
    };
    std::vector<Symbol> sym;
    int32_t pending_unk = -1;  // an unk not yet added (fused ones grow)
    auto add = [&](int32_t id) { sym.push_back(Symbol{id, int(sym.size()) - 1, int(sym.size()) + 1}); };
    auto unk_id = [&] {
      auto it = vocab.find(*unk_token);
      if (it == vocab.end())
        fail("tokenizer: BPE: unk_token {} is not in the vocabulary", json(*unk_token).dump());
      return it->second;
    };
    for (size_t i = 0; i < word32.size(); ++i) {
      std::string s;
      if (i > 0 && prefix) s = *prefix;
      append_utf8(s, word32[i]);
      if (i + 1 == word32.size() && suffix) s += *suffix;
      if (auto it = vocab.find(s); it != vocab.end()) {
        if (pending_unk >= 0) add(pending_unk);
        pending_unk = -1;
        add(it->second);
        continue;
      }
      if (byte_fallback) {
        std::vector<int32_t> bytes;
        for (unsigned char b : s) {
          auto it = vocab.find(fmt::format("<0x{:02X}>", b));
          if (it == vocab.end()) break;
          bytes.push_back(it->second);
        }
        if (bytes.size() == s.size()) {
          // (A pending unk stays pending, as in the crate.)
          for (int32_t b : bytes) add(b);
          continue;
        }
      }
      if (unk_token) {
        if (pending_unk >= 0 && !fuse_unk) add(pending_unk);
        if (pending_unk < 0 || !fuse_unk) pending_unk = unk_id();
      }
      // Without an unk token, a character outside the vocabulary is dropped.
    }
    if (pending_unk >= 0) add(pending_unk);
    if (sym.empty()) return;
    sym.back().next = -1;

    struct Candidate {
      uint32_t rank;
      int pos;
      int32_t merged;
      bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Candidate> queue;
    auto consider = [&](int pos) {
      const int next = sym[size_t(pos)].next;
      if (next < 0) return;
      auto it = merges.find(key(sym[size_t(pos)].id, sym[size_t(next)].id));
      if (it != merges.end()) queue.push(Candidate{it->second.first, pos, it->second.second});
    };
    for (int i = 0; i + 1 < int(sym.size()); ++i) consider(i);
    while (!queue.empty()) {
      const Candidate top = queue.top();
      queue.pop();
      Symbol& left = sym[size_t(top.pos)];
      if (left.gone || left.next < 0) continue;
      Symbol& right = sym[size_t(left.next)];
      // A stale entry: the pair changed since it was queued.
      auto it = merges.find(key(left.id, right.id));
      if (it == merges.end() || it->second.second != top.merged) continue;
      left.id = top.merged;
      right.gone = true;
      left.next = right.next;
      if (right.next >= 0) sym[size_t(right.next)].prev = top.pos;
      if (left.prev >= 0) consider(left.prev);
      consider(top.pos);
    }
    for (const Symbol& s : sym)
      if (!s.gone) emit(s.id);
  }
};

}  // namespace

std::unique_ptr<Model> load_bpe(const json& m, const Source& src) {
  const std::string& file = src.file;
  auto bpe = std::make_unique<Bpe>();
  const json& dropout = member(m, file, "model", "dropout");
  if (!dropout.is_null())
    fail("tokenizer: {}: model.dropout is {}: hone supports BPE without dropout only (null)", file, dropout.dump());
  auto optional_string = [&](const char* key) -> std::optional<std::string> {
    const json& v = member(m, file, "model", key);
    if (v.is_null()) return std::nullopt;
    if (!v.is_string()) wrong_type(file, field_name("model", key), "a string or null", v);
    return v.get<std::string>();
  };
  bpe->unk_token = optional_string("unk_token");
  bpe->prefix = optional_string("continuing_subword_prefix");
  bpe->suffix = optional_string("end_of_word_suffix");
  auto optional_bool = [&](const char* key) {
    const json& v = member(m, file, "model", key);
    if (v.is_null()) return false;
    if (!v.is_boolean()) wrong_type(file, field_name("model", key), "true, false or null", v);
    return v.get<bool>();
  };
  bpe->fuse_unk = optional_bool("fuse_unk");
  bpe->byte_fallback = optional_bool("byte_fallback");
  bpe->ignore_merges = optional_bool("ignore_merges");

  const json& vocab = member(m, file, "model", "vocab");
  if (!vocab.is_object()) wrong_type(file, "model.vocab", "an object of token: id", vocab);
  for (const auto& [tok, id_json] : vocab.items())
    bpe->add_token(tok, read_id(id_json, file, fmt::format("token {}", json(tok).dump()), src.defined));

  // Merges: ["a b", ...] (older files; "#version" lines skipped) or [["a", "b"], ...].
  const json& merges = member(m, file, "model", "merges");
  if (!merges.is_array()) wrong_type(file, "model.merges", "an array of merges", merges);
  const size_t prefix_len = bpe->prefix ? bpe->prefix->size() : 0;
  uint32_t rank = 0;
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& e = merges[i];
    std::string a, b;
    if (e.is_string()) {
      const std::string line = e.get<std::string>();
      if (line.starts_with("#version")) continue;
      const size_t sp = line.find(' ');
      if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos)
        fail("tokenizer: {}: model.merges[{}] is {}: a merge is two tokens separated by one space", file, i,
             json(line).dump());
      a = line.substr(0, sp);
      b = line.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      wrong_type(file, fmt::format("model.merges[{}]", i), "\"a b\" or [\"a\", \"b\"]", e);
    }
    auto id_of = [&](const std::string& t) {
      auto it = bpe->vocab.find(t);
      if (it == bpe->vocab.end())
        fail("tokenizer: {}: model.merges[{}]: token {} is not in model.vocab", file, i, json(t).dump());
      return it->second;
    };
    const int32_t ia = id_of(a), ib = id_of(b);
    if (b.size() < prefix_len)
      fail("tokenizer: {}: model.merges[{}]: {} is shorter than the continuing_subword_prefix", file, i,
           json(b).dump());
    const int32_t merged = id_of(a + b.substr(prefix_len));
    bpe->merges[Bpe::key(ia, ib)] = {rank++, merged};  // a repeated pair keeps its last rank
  }
  return bpe;
}

}  // namespace hone::tok
