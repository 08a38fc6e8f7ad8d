// Unigram (sentencepiece's model) as the crate's models/unigram: the segmentation of a word
// into vocabulary pieces with the highest total score (Viterbi over UTF-8 byte positions);
// a character no piece covers costs the lowest score minus 10 and becomes unk, and
// adjacent unks fuse into one.
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "data/tokenizer_parts.h"
#include "hone/error.h"

namespace hone::tok {
namespace {

class Unigram final : public Model {
 public:
  std::vector<double> scores;  // by id
  std::optional<int32_t> unk_id;
  double min_score = std::numeric_limits<double>::infinity();
  // A byte trie of the pieces: node -> children by (node << 8 | byte); a node's piece id.
  std::unordered_map<uint64_t, uint32_t> children;
  std::vector<int32_t> node_piece{-1};

  std::string_view type() const override { return "Unigram"; }

  void insert(const std::string& piece, int32_t id) {
    uint32_t node = 0;
    for (unsigned char c : piece) {
      auto [it, added] = children.try_emplace((uint64_t(node) << 8) | c, uint32_t(node_piece.size()));
      if (added) node_piece.push_back(-1);
      node = it->second;
    }
    node_piece[node] = id;
  }

  void tokenize(const std::u32string& word32, std::vector<int32_t>& ids,
                std::vector<std::string>* pieces) const override {
    if (word32.empty()) return;
    const std::string s = encode_utf8(word32);
    const double unk_score = min_score - 10.0;
    struct Node {
      int32_t id = 0;
      double score = 0;
      std::optional<size_t> start;
    };
    std::vector<Node> best(s.size() + 1);
    auto char_len = [](unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; };
    for (size_t start = 0; start < s.size();) {
      const double here = best[start].score;
      const size_t mblen = size_t(char_len(static_cast<unsigned char>(s[start])));
      bool single = false;
      // Pieces that start here, shortest first (the crate's trie order).
      uint32_t node = 0;
      for (size_t end = start; end < s.size(); ++end) {
        auto it = children.find((uint64_t(node) << 8) | static_cast<unsigned char>(s[end]));
        if (it == children.end()) break;
        node = it->second;
        const int32_t id = node_piece[node];
        if (id < 0) continue;
        Node& target = best[end + 1];
        const double score = scores[size_t(id)] + here;
        if (!target.start || score > target.score) target = Node{id, score, start};
        if (end + 1 - start == mblen) single = true;
      }
      if (!single) {
        if (!unk_id) fail("tokenizer: Unigram: the text needs an unknown token but the model has no unk_id");
        Node& target = best[start + mblen];
        const double score = unk_score + here;
        if (!target.start || score > target.score) target = Node{*unk_id, score, start};
      }
      start += mblen;
    }
    // Back from the end; runs of unk fuse into one piece.
    std::vector<std::string> out;
    std::string unk_run;
    for (size_t end = s.size(); end > 0;) {
      const Node& n = best[end];
      const size_t start = *n.start;
      std::string piece = s.substr(start, end - start);
      if (unk_id && n.id == *unk_id) {
        unk_run.insert(0, piece);
      } else {
        if (!unk_run.empty()) out.push_back(std::move(unk_run));
        unk_run.clear();
        out.push_back(std::move(piece));
      }
      end = start;
    }
    if (!unk_run.empty()) out.push_back(std::move(unk_run));
    for (auto it = out.rbegin(); it != out.rend(); ++it) {
      auto v = vocab.find(*it);
      if (v != vocab.end()) {
        ids.push_back(v->second);
        if (pieces) pieces->push_back(*it);
      } else {
        ids.push_back(*unk_id);
        if (pieces) pieces->push_back(tokens[size_t(*unk_id)]);
      }
    }
  }
};

}  // namespace

std::unique_ptr<Model> load_unigram(const json& m, const Source& src) {
  const std::string& file = src.file;
  auto u = std::make_unique<Unigram>();
  if (get_bool(m, file, "model", "byte_fallback", false))
    fail("tokenizer: {}: model.byte_fallback is true: hone supports Unigram without byte fallback only", file);
  const json& vocab = member(m, file, "model", "vocab");
  if (!vocab.is_array()) wrong_type(file, "model.vocab", "an array of [piece, score]", vocab);
  if (vocab.empty()) fail("tokenizer: {}: model.vocab is empty", file);
  for (size_t i = 0; i < vocab.size(); ++i) {
    const json& e = vocab[i];
    if (!e.is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_number())
      wrong_type(file, fmt::format("model.vocab[{}]", i), "a [piece, score] pair", e);
    const std::string piece = e[0].get<std::string>();
    const double score = e[1].get<double>();
    u->add_token(piece, int32_t(i));
    u->scores.push_back(score);
    u->min_score = std::min(u->min_score, score);
    u->insert(piece, int32_t(i));
  }
  const json& unk = member(m, file, "model", "unk_id");
  if (!unk.is_null()) u->unk_id = read_id(unk, file, "model.unk_id", vocab.size());
  return u;
}

}  // namespace hone::tok
